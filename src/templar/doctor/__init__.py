"""`templar doctor`: every check a node's start-up and first windows depend on, before it runs.

Nodes that fail late and obscurely cost their operators TAO and hours: a hotkey registered on the
wrong netuid, a bucket key that cannot write (or a read key that can), a clock off by seconds, a
corpus that does not match the run, a GPU that runs out of memory after the checkpoint download.
Each check here is one function (`Doctor` in, `CheckResult` out) that makes the real requests a node
would, with deadlines, and says what to fix:

    hparams, wallet, chain (reachable, block time, clock skew), registration (stake, permit),
    weights-settings (rate limit, commit-reveal: validators), lead-run (our digest = the lead's),
    bucket-locator (and write key), bucket-write, bucket-read, bucket-read-only, bucket-throughput,
    manifest (= the pinned digest), cache-space, gpu, host-memory, state-disk
"""

from templar.doctor.context import Doctor
from templar.doctor.result import CheckResult, Status
from templar.doctor.runner import CHECKS, run_checks

__all__ = ["CHECKS", "CheckResult", "Doctor", "Status", "run_checks"]
