"""The whole subnet on one machine: embedded chain, local buckets, real neuron processes."""
