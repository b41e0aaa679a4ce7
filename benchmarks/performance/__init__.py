"""Performance: what the nodes' code costs, each figure against a baseline measured in the same process
(compression, data pages on demand, gather, a miner's window, the validator's evaluation, 1 vs 2 ranks,
the model fingerprint, the lead's hand-over, and the one-call GPU run `gpu` with its parts)."""
