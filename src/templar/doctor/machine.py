"""Checks of the machine and the run's data: the corpus manifest against the pinned digest, the
page cache's disk, the GPU's memory against the sizing of this role, host memory, and the disk for
the node's state."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from templar.data import ManifestError
from templar.data.plan import disjoint_assignment_pages
from templar.data.reader import load_manifest
from templar.data.source import check_geometry, corpus_bucket
from templar.doctor.chain import small_model
from templar.doctor.context import Doctor
from templar.doctor.result import CheckResult, failed, ok, skipped, warning
from templar.storage import StorageError
from templar.storage.locator import LocatorError

GB = 1e9


async def check_manifest(d: Doctor) -> CheckResult:
    """The run's corpus is published, its manifest readable, its sha256 the digest pinned in hparams
    and its pages cut as hparams say (else the node stops at start, after loading everything else)."""
    if d.hp is None:
        return skipped("manifest", "needs hparams")
    data = d.hp.data
    if not data.manifest:
        return failed("manifest", f"this run's corpus is not published yet (data.manifest is empty in "
                                  f"{d.args.hparams or 'hparams.json'}): a node with these hparams stops at start "
                                  "(exit code 3)",
                      "nothing to fix on this machine: run the release of the hparams that pins the corpus once the "
                      "subnet owner has published it (docs/launch.md §11); an owner publishes it with `templar data "
                      "prepare` and pins it with `templar data pin`")
    location = d.args.data_locator or data.corpus
    if not location:
        return failed("manifest", "no corpus location (hparams data.corpus is empty)", "pass --data.locator")
    prefix = data.corpus_prefix if d.args.data_prefix is None else d.args.data_prefix
    try:
        bucket = corpus_bucket(location, allow_private=not d.public)
    except (LocatorError, StorageError) as exc:
        return failed("manifest", f"corpus {location[:60]}: {exc}", "check hparams data.corpus or --data.locator")
    try:
        async with bucket:
            manifest = await load_manifest(bucket, prefix, data.manifest, None, timeout=d.timeout, attempts=1)
        check_geometry(manifest, d.hp)
    except ManifestError as exc:
        return failed("manifest", str(exc), "read the run's corpus (hparams data.corpus) or a true mirror of it; an "
                      "owner who republished the corpus pins the new one with `templar data pin` (docs/launch.md §5)")
    except StorageError as exc:
        return failed("manifest", f"the corpus manifest is unreadable: {exc}", "check the data bucket and the network")
    line = f"corpus {manifest.name}: {manifest.num_pages:,} pages, manifest {data.manifest[:16]}… as pinned"
    needed = disjoint_assignment_pages(data.pages_per_window, data.holdout_fraction)
    if manifest.num_pages < needed:
        return warning("manifest", f"{line}; fewer than the {needed:,} pages that keep every uid's assignment apart",
                       "fine for a rehearsal with a few miners; a public run's owner publishes more text "
                       "(docs/data.md)", pages=manifest.num_pages)
    return ok("manifest", line, pages=manifest.num_pages)


def _free(path: Path) -> tuple[Path, float]:
    """The nearest existing folder of `path` and its free bytes."""
    path = path.expanduser().resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path, float(shutil.disk_usage(path).free)


async def check_cache_space(d: Doctor) -> CheckResult:
    """The page cache's folder has room for `--data.cache_gb` (the cache evicts beyond it)."""
    folder = d.args.data_cache_dir or d.state_dir / "data"
    where, free = _free(folder)
    want = d.args.data_cache_gb * (1 << 30)
    line = f"{folder}: {free / GB:,.1f} GB free for a cache of up to {want / GB:,.1f} GB"
    if d.sizing is not None and free < 4 * d.sizing["page_cache_mb_per_window"] * 1e6:
        return failed("cache-space", f"{line}: not even a few windows of pages fit", "free disk, or --data.cache_dir "
                      "elsewhere", free_bytes=free)
    if free < want:
        return warning("cache-space", line, f"lower --data.cache_gb below {free / (1 << 30):.0f}, or free disk on {where}",
                       free_bytes=free)
    return ok("cache-space", line, free_bytes=free)


def _state_bytes(d: Doctor) -> float:
    """The node's own disk: its state file twice (the new one is written before the old one goes;
    `.prev` is a hard link), the lead's checkpoint downloaded to join, and for a validator that may
    lead, a checkpoint snapshot. Model and (miner) error feedback in float32."""
    n = d.sizing["parameters"] if d.sizing else 0
    state = 4 * n * (2 if d.role == "miner" else 1)
    return 2 * state + 4 * n + (4 * n if d.role == "validator" else 0)


async def check_state_disk(d: Doctor) -> CheckResult:
    """The state folder's disk holds the node's state files and a checkpoint."""
    if d.sizing is None:
        return skipped("state-disk", "needs hparams")
    _where, free = _free(d.state_dir)
    need = _state_bytes(d)
    line = f"{d.state_dir}: {free / GB:,.1f} GB free, the node needs about {need / GB:,.2f} GB"
    if free < need:
        return failed("state-disk", line, "free disk, or --state.dir on a larger disk", free_bytes=free, need_bytes=need)
    return ok("state-disk", line, free_bytes=free, need_bytes=need)


def _meminfo() -> dict[str, float]:
    out = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            name, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                out[name] = float(parts[0]) * 1024
    except OSError:
        pass
    return out


async def check_host_memory(d: Doctor) -> CheckResult:
    """Host memory: loading a checkpoint and writing state hold a float32 copy of the model or two."""
    if d.sizing is None:
        return skipped("host-memory", "needs hparams")
    info = _meminfo()
    if "MemAvailable" not in info:
        return warning("host-memory", "cannot read /proc/meminfo", "check by hand: at least "
                       f"{(8 * d.sizing['parameters'] + 2e9) / GB:.1f} GB")
    need = 8 * d.sizing["parameters"] + 2e9
    available = info["MemAvailable"]
    line = f"{available / GB:,.1f} GB available of {info.get('MemTotal', 0) / GB:,.1f} GB; about {need / GB:,.1f} GB needed"
    if available < need:
        return warning("host-memory", line, "close other programs or use a larger machine (checkpoints load through "
                       "host memory)", available_bytes=available, need_bytes=need)
    return ok("host-memory", line, available_bytes=available, need_bytes=need)


async def check_gpu(d: Doctor) -> CheckResult:
    """The device the node will use (`--device`) and, on a GPU, its memory against this role's
    sizing (`templar hparams`): a node that does not fit dies with out-of-memory after its download."""
    if d.sizing is None:
        return skipped("gpu", "needs hparams")
    import torch

    need = d.sizing["miner_gpu_memory_gb" if d.role == "miner" else "validator_gpu_memory_gb"] * GB
    flag = d.args.device
    cuda = flag.startswith("cuda") or (flag == "auto" and torch.cuda.is_available())
    if not cuda:
        line = f"CPU ({flag}): no GPU"
        if small_model(d):
            return ok("gpu", f"{line}; this preset's {d.sizing['parameters'] / 1e6:.1f}M parameters fit a CPU")
        return failed("gpu", f"{line} for a {d.sizing['parameters'] / 1e9:.2f}B-parameter model",
                      f"run on a GPU with at least {need / GB:.0f} GB (or --device cuda)", need_bytes=need)
    if not torch.cuda.is_available():
        return failed("gpu", f"--device {flag} but torch sees no CUDA device", "check the driver and the torch build")
    device = torch.device("cuda" if flag == "auto" else flag)
    try:
        free, total = await asyncio.to_thread(torch.cuda.mem_get_info, device)
        name = torch.cuda.get_device_name(device)
    except (RuntimeError, AssertionError) as exc:
        return failed("gpu", f"{flag}: {exc}", "check --device and the driver")
    line = f"{name}: {total / GB:,.1f} GB ({free / GB:,.1f} free); this role needs about {need / GB:,.1f} GB"
    data = {"total_bytes": total, "free_bytes": free, "need_bytes": need}
    if total < need:
        return failed("gpu", line, "a GPU with more memory, or run over several GPUs with torchrun (docs/mining.md)",
                      **data)
    if free < need:
        return warning("gpu", f"{line}: other processes hold some of it", "stop them before starting the node",
                       **data)
    return ok("gpu", line, **data)
