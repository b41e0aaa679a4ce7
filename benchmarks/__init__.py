"""The project's measurements, grouped by purpose; each script is run from the repository root as
`python -m benchmarks.<group>.<name>` and writes what it measured to `benchmarks/results/`.

- `benchmarks.performance`: what the nodes' code costs (compression, data pages, gather, the
  miner's window, the validator's evaluation, ranks, the fingerprint, the lead's hand-over, and the
  one-call GPU run `benchmarks.performance.gpu`), each against a baseline in the same process.
- `benchmarks.incentive`: calibration of the incentive (the Gauntlet on real updates, the
  subnet-scale simulator through Yuma and its scenarios, localnets with several validators, the
  honest similarity distributions behind the duplicate and borrowed-work checks, the sync check
  under each outer rule).
- `benchmarks.research`: open questions the design answered by measurement (convergence of the
  outer rules against AdamW data-parallel).

`benchmarks._common` holds the helpers the tiny-preset benchmarks share; `benchmarks/presets/`
the presets some of them run; `benchmarks/LOG.md` the decisions the figures led to.
"""
