"""`templar dashboard`: the operator's live, local, read-only web view of a subnet.

    templar dashboard --localnet localnet/                      # a localnet's --out directory
    templar dashboard --validator.dir ~/.templar/W/H --subtensor.network finney --netuid 3

Modules, one idea each:

- `jsonl`: incremental JSONL tailing that survives torn, invalid and rotated files.
- `sources`: what the dashboard reads (validator and miner state dirs, a localnet directory)
  turned into bounded in-memory histories; it never opens a secret.
- `chainwatch`: the chain (metagraph, weights, stake, commitments) polled in a thread under a
  deadline, plus the validator-agreement maths.
- `svg`: sparklines and line/bar charts drawn server-side as SVG (no CDN, no third-party JS).
- `views`: the HTML pages.
- `app`: the Starlette app (routes, server-sent events, security headers).
- `server`: binding rules and uvicorn, in the foreground or a background thread.
- `cli`: the `templar dashboard` subcommand.
"""
