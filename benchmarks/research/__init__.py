"""Research: questions of the training method answered by measurement, such as convergence over many
windows of each outer rule against AdamW data-parallel on the same tokens (`convergence`)."""
