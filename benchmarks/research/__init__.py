"""Research: questions of the training method answered by measurement, such as convergence over many
windows of each outer rule against AdamW data-parallel on the same tokens (`convergence`: the report
and its command line; `convergence_runs`: what a run is and how it trains; `convergence_plan`: which
runs each stage of the plan adds)."""
