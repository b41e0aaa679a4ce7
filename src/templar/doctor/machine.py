"""Checks of the machine and the run's data: the corpus manifest against the pinned digest, the
page cache's disk, the GPU against the memory table of this role (`templar.tools.sizing`: the
setting that fits and its flags), host memory, the disk for the node's state, and the files the
node may keep open."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from templar.core.startup import OPEN_FILES_NEEDED, open_files_target
from templar.data import ManifestError
from templar.data.plan import disjoint_assignment_pages
from templar.data.reader import load_manifest
from templar.data.source import check_geometry, corpus_bucket
from templar.doctor.chain import small_model
from templar.doctor.context import Doctor
from templar.doctor.result import CheckResult, failed, ok, skipped, warning
from templar.runtime.flags import memory_settings
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


async def check_state_disk(d: Doctor) -> CheckResult:
    """The state folder's disk holds the node's state file twice (the new one is written before the
    old one goes) and a checkpoint (`tools.sizing.node_disk_bytes`)."""
    if d.sizing is None:
        return skipped("state-disk", "needs hparams")
    _where, free = _free(d.state_dir)
    need = d.sizing[f"{d.role}_disk_gb"] * GB
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
    """Host memory against this role's memory under its flags (`tools.sizing.model_memory`): the
    state file's save and load, the outer step's update and, with `--memory.offload`, the state
    the GPU no longer holds."""
    if d.sizing is None or d.hp is None:
        return skipped("host-memory", "needs hparams")
    from templar.tools.sizing import model_memory

    setting = memory_settings(d.args)
    need = model_memory(d.hp, d.role, setting).host_bytes
    info = _meminfo()
    if "MemAvailable" not in info:
        return warning("host-memory", "cannot read /proc/meminfo", f"check by hand: at least {need / GB:.1f} GB")
    available = info["MemAvailable"]
    line = (f"{available / GB:,.1f} GB available of {info.get('MemTotal', 0) / GB:,.1f} GB; about {need / GB:,.1f} GB "
            f"needed ({setting.name})")
    if available < need:
        return warning("host-memory", line, "close other programs or use a larger machine (the state file and, with "
                       "--memory.offload, the optimizer state live in host memory)", available_bytes=available,
                       need_bytes=need)
    return ok("host-memory", line, available_bytes=available, need_bytes=need)


async def check_gpu(d: Doctor) -> CheckResult:
    """The device the node will use (`--device`) and, on a GPU, its memory against this role's
    memory table (`templar hparams`): a node that does not fit dies with out-of-memory after its
    download. For a miner it names the memory setting that fits, and its flags."""
    if d.sizing is None or d.hp is None:
        return skipped("gpu", "needs hparams")
    import torch

    flag = d.args.device
    present = torch.cuda.is_available()
    if not (flag.startswith("cuda") or (flag == "auto" and present)):
        return cpu_verdict(d, flag, present)
    if not present:
        return failed("gpu", f"--device {flag} but torch sees no CUDA device", "check the driver and the torch build "
                      "(`python -c 'import torch; print(torch.cuda.is_available())'`)")
    device = torch.device("cuda" if flag == "auto" else flag)
    try:
        free, total = await asyncio.to_thread(torch.cuda.mem_get_info, device)
        name = torch.cuda.get_device_name(device)
    except (RuntimeError, AssertionError) as exc:
        return failed("gpu", f"{flag}: {exc}", "check --device and the driver")
    return gpu_verdict(d, name, float(total), float(free))


def cpu_verdict(d: Doctor, flag: str, gpu_present: bool) -> CheckResult:
    """The node would compute on the CPU: fine for the tiny presets; otherwise say what GPU it
    needs, and never suggest `--device cuda` to a machine without one."""
    from templar.tools.sizing import SETTINGS, USABLE_SHARE, model_memory

    params = d.sizing["parameters"]
    if small_model(d):
        return ok("gpu", f"CPU ({flag}): this preset's {params / 1e6:.1f}M parameters fit a CPU")
    least = model_memory(d.hp, d.role, SETTINGS[-1] if d.role == "miner" else SETTINGS[0])
    if gpu_present:
        return failed("gpu", f"--device {flag} for a {params / 1e9:.2f}B-parameter model, on a machine with a GPU",
                      "drop --device (auto uses the GPU) or pass --device cuda", need_bytes=least.gpu_bytes)
    flags = " ".join(least.setting.flags)
    how = f" (with {flags})" if flags else ""
    card = least.gpu_bytes / USABLE_SHARE
    return failed("gpu", f"no GPU on this machine: a {params / 1e9:.2f}B-parameter model cannot train a window on a CPU",
                  f"run the {d.role} on a machine with an NVIDIA GPU of at least {card / GB:.0f} GB{how}; "
                  "docs/mining.md §1 lists what each GPU size needs", need_bytes=least.gpu_bytes)


def gpu_verdict(d: Doctor, name: str, total: float, free: float) -> CheckResult:
    """This role's memory under its flags against a GPU of `total` bytes (`free` of them free): ok,
    the setting that fits instead (its flags), or how many GPUs under torchrun would."""
    from templar.tools.sizing import SETTINGS, fewest_ranks, fits, model_memory, recommend, usable_bytes

    setting = memory_settings(d.args) if d.role == "miner" else SETTINGS[0]
    chosen = model_memory(d.hp, d.role, setting)
    need = chosen.gpu_bytes
    line = (f"{name}: {total / GB:,.1f} GB ({free / GB:,.1f} free); this {d.role} needs about {need / GB:,.1f} GB "
            f"({setting.name if d.role == 'miner' else 'its evaluation'}), {usable_bytes(total) / GB:,.1f} GB usable")
    data = {"total_bytes": total, "free_bytes": free, "need_bytes": need, "setting": setting.name}
    best = recommend(d.hp, d.role, total)
    if not fits(chosen, total):
        if best is not None:
            flags = " ".join(best.setting.flags)
            return failed("gpu", f"{line}: does not fit", f"add {flags} ({best.setting.name}: about "
                          f"{best.gpu_bytes / GB:.1f} GB; docs/mining.md §1 gives its cost in time)",
                          recommended=list(best.setting.flags), **data)
        widest = SETTINGS[-1] if d.role == "miner" else SETTINGS[0]
        ranks = fewest_ranks(d.hp, d.role, total, widest)
        flags = " ".join(widest.flags)
        over = f"torchrun over {ranks} such GPUs" if ranks else "more GPUs than 64 of this size"
        return failed("gpu", f"{line}: no memory setting fits one GPU of this size",
                      f"run the node with {over}" + (f" and {flags}" if flags else "") + " (docs/mining.md §12), or "
                      "use a GPU with more memory", torchrun_ranks=ranks, **data)
    if free < need:
        return warning("gpu", f"{line}: other processes hold some of it", "stop them before starting the node", **data)
    faster = best is not None and SETTINGS.index(best.setting) < SETTINGS.index(setting)
    late = window_time(d, name, chosen) if d.role == "miner" else None
    if late is not None:
        fix = "a faster GPU, or torchrun over several (each trains its share of the pages; docs/mining.md §12)"
        if faster:
            fix = ("drop the memory flags: the default setting fits this GPU" if not best.setting.flags else
                   f"use {' '.join(best.setting.flags)} alone ({best.setting.name} fits this GPU)") + \
                " and costs less time per window"
        return warning("gpu", f"{line}; {late}", fix, **data)
    if faster:
        return ok("gpu", f"{line}; {best.setting.name} fits too and costs less time per window", **data)
    return ok("gpu", line, **data)


def window_time(d: Doctor, name: str, memory) -> str | None:
    """Why a miner on this GPU would miss its commitment deadline: its training time at the table's
    MFU (the data-sheet peak of a known GPU) plus what its memory setting adds, against the time a
    window leaves for training; None when it fits or the GPU's peak is unknown."""
    from templar.tools.sizing import PEAK_BF16_FLOPS, setting_seconds

    peak = next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)
    if peak is None:
        return None
    s = d.sizing
    train = s["train_flops_per_window"] / (peak * s["mfu_assumed"])
    transfer, recompute = setting_seconds(memory, train)
    total, span = train + transfer + recompute, s["miner_compute_span_seconds"]
    if total <= span:
        return None
    return (f"a window's training takes about {total:.0f} s here ({train:.0f} s at {s['mfu_assumed']:.0%} MFU"
            + (f", {transfer + recompute:.0f} s for the memory setting" if transfer + recompute else "")
            + f"), the window leaves {span:.1f} s: payloads would miss their commitment deadline")


async def check_open_files(d: Doctor) -> CheckResult:
    """The open-files limit the node will run with (it raises its soft limit towards the hard one,
    `core.startup.raise_open_files_limit`) against a full subnet's validator's peak."""
    try:
        import resource
    except ImportError:
        return skipped("open-files", "this platform has no open-files limit")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    gets = open_files_target(soft, hard)
    line = ("the node may keep any number of files open" if gets < 0 else
            f"the node may keep {gets:,} files open (this shell: {soft if soft >= 0 else 'unlimited'}, "
            f"hard limit {hard if hard >= 0 else 'unlimited'})")
    if d.role == "validator" and 0 <= gets < OPEN_FILES_NEEDED:
        return warning("open-files", line, f"raise the hard limit to {OPEN_FILES_NEEDED:,} or more (systemd "
                       "LimitNOFILE=, docker --ulimit nofile=, /etc/security/limits.conf): a validator connects "
                       "to every miner's bucket at once", open_files=gets)
    return ok("open-files", line, open_files=gets)
