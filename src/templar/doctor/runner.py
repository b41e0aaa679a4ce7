"""The checks in order, for one role: each runs whatever happened before it (a later check says
"skipped" when an earlier one left it nothing to check), and the probe object is always removed."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from loguru import logger

from templar.doctor.bucket import (
    check_bucket_locator,
    check_bucket_read,
    check_bucket_read_only,
    check_bucket_throughput,
    check_bucket_write,
    cleanup_probe,
)
from templar.doctor.chain import (
    check_chain,
    check_hparams,
    check_lead_run,
    check_registration,
    check_wallet,
    check_weights_settings,
)
from templar.doctor.context import Doctor
from templar.doctor.machine import (
    check_cache_space,
    check_gpu,
    check_host_memory,
    check_manifest,
    check_open_files,
    check_state_disk,
)
from templar.doctor.result import CheckResult, failed

Check = Callable[[Doctor], Awaitable[CheckResult]]

CHECKS: tuple[Check, ...] = (
    check_hparams, check_wallet, check_chain, check_registration, check_weights_settings, check_lead_run,
    check_bucket_locator, check_bucket_write, check_bucket_read, check_bucket_read_only, check_bucket_throughput,
    check_manifest, check_cache_space, check_gpu, check_host_memory, check_state_disk, check_open_files,
)
"""Every check a node's start-up and first windows depend on, in the order they would bite."""

ROLES = ("miner", "validator")


async def run_checks(d: Doctor, checks: tuple[Check, ...] = CHECKS) -> list[CheckResult]:
    """Run `checks` in order; a check that raises is a failed check (with its error), never a crash."""
    if d.role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {d.role!r}")
    results: list[CheckResult] = []
    try:
        for check in checks:
            name = check.__name__.removeprefix("check_").replace("_", "-")
            try:
                results.append(await check(d))
            except Exception as exc:  # a doctor must report, not crash: the traceback goes to the debug log
                logger.opt(exception=exc).debug(f"check {name} raised")
                results.append(failed(name, f"the check itself failed: {type(exc).__name__}: {exc}",
                                      "report this with `templar doctor --json` output"))
    finally:
        await cleanup_probe(d)
        await d.close()
    return results
