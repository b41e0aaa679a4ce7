"""One model and one history, whatever the clock or the disk: real nodes on virtual time.

- every node takes exactly the lead's step, also one whose clock lags and one whose gather saw
  another set than the lead's (the rule of `templar.runtime.consensus.follow`);
- a lead restarted on an empty directory whose newest checkpoint is corrupt replays the run's own
  published history from an older intact checkpoint and rewrites nothing; unreadable history (a torn
  start window, every checkpoint torn) is never taken for "no run yet": one line, and exit 8 where the
  lead cannot go on;
- one node per state directory; a state directory on a full disk or over a file-size limit costs
  one line per window, and three in a row stop the node with its own exit code.
"""

from __future__ import annotations

import asyncio
import hashlib
import resource
import subprocess
from pathlib import Path

import pytest
from loguru import logger

from templar.comms import get_inputs
from templar.comms.keys import checkpoint_file_key, checkpoint_prefix
from templar.core.clock import loop_time, run_virtual
from templar.core.config import load_hparams
from templar.miner.loop import Miner
from templar.runtime.consensus.windows import Clock
from templar.runtime.flags import EXIT_HISTORY, EXIT_STATE_DISK, EXIT_STATE_LOCKED
from templar.runtime.node import StateDiskError, StateLockedError
from templar.storage import StorageError
from templar.validator.lead import LeadError
from templar.validator.loop import Validator
from templar.wire import max_inputs_bytes, read_inputs

from .harness import Subnet, parameters, same_parameters

pytestmark = pytest.mark.timeout(300)


class LogLines(list):
    """Loguru messages at `level` (WARNING) and above while the context is open."""

    def __init__(self, level: str = "WARNING") -> None:
        super().__init__()
        self.level = level

    def __enter__(self) -> LogLines:
        self.handler = logger.add(lambda m: self.append(m.record["message"]), level=self.level)
        return self

    def __exit__(self, *exc) -> None:
        logger.remove(self.handler)


class Lagging:
    """A machine clock `behind` seconds behind the true time."""

    def __init__(self, behind: float) -> None:
        self.true, self.behind = loop_time(), behind

    def now(self) -> float:
        return self.true.now() - self.behind


def theta(node) -> str:
    h = hashlib.sha256()
    for name, p in sorted(parameters(node).items()):
        h.update(name.encode())
        h.update(p.numpy().tobytes())
    return h.hexdigest()[:16]


async def _windows(lead: Validator, miners: list[Miner], count: int) -> list[dict[str, str]]:
    """Run `count` windows; after each, θ of every node (they must all hold the same)."""
    seen = []
    for _ in range(count):
        w = lead.state.window + 1
        await asyncio.gather(lead.run_window(w), *(m.run_window(w) for m in miners))
        seen.append({role.node.hotkey[:6]: theta(role.node) for role in (lead, *miners)})
    return seen


class Unreadable:
    """A peer's bucket as one node sees it: reads of `key` fail while `on` (a stalled route)."""

    def __init__(self, inner, key: str) -> None:
        self.inner, self.key, self.on = inner, key, False

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def head(self, key, *a, **kw):
        if self.on and key == self.key:
            raise StorageError(f"{self.inner.name}/{key}: connection reset")
        return await self.inner.head(key, *a, **kw)


@pytest.mark.slow(seconds=9)
def test_every_node_takes_the_leads_step_whatever_its_clock_or_its_gather_saw(tmp_path):
    """A miner whose clock is 1 s behind the chain (more than clock_skew_seconds) and a window in
    which the lead cannot read one top-G miner's payload that everyone else reads: every node
    holds the same θ after every window, and the lagging node says once that its clock is off.
    Then its clock runs 4 s ahead: its commitment deadline passes by its own clock, and the line
    says the clock is the cause, not the training."""
    from templar.comms.keys import gradient_key

    subnet = Subnet.create(tmp_path, {"lead": 100.0, "m0": 0.0, "m1": 0.0, "lag": 0.0})

    async def scenario():
        v = Validator(await subnet.node("lead"))
        miners = [Miner(await subnet.node(name)) for name in ("m0", "m1", "lag")]
        lag = miners[2]
        lag.node.clock = Clock(lag.node.hp.windows, lag.node.chain.block, lag.node.chain.block_timestamp,
                               Lagging(1.0))
        for role in (v, *miners):
            await role.start()
        with LogLines() as lines:
            seen = await _windows(v, miners, 4)  # m0 and m1 earn their places in the top-G
            m0 = miners[0].node.hotkey
            assert {m0, miners[1].node.hotkey} <= set(v.book.top_g(v.hp.gauntlet)), v.book.scores(v.hp.gauntlet)
            # the lead's route to m0's bucket fails for one window: its inputs leave m0 out
            bucket = (await v.node.peer_buckets([m0]))[m0]
            route = Unreadable(bucket, gradient_key(v.state.window + 1))
            v.node._peer_buckets[m0] = (v.node._peer_buckets[m0][0], route)
            route.on = True
            seen += await _windows(v, miners, 1)
            route.on = False
            data = await get_inputs(v.node.bucket, v.state.window, max_bytes=max_inputs_bytes())
            inputs = read_inputs(data, run=v.node.run, verify=None)
            names = {role.node.hotkey: name for name, role in (("m0", miners[0]), ("m1", miners[1]), ("lag", lag))}
            aggregated = [names[hk] for hk in inputs.hotkeys]
            assert "m1" in aggregated and "m0" not in aggregated, aggregated
            seen += await _windows(v, miners, 2)
            lag.node.clock = Clock(lag.node.hp.windows, lag.node.chain.block, lag.node.chain.block_timestamp,
                                   Lagging(-4.0))
            seen += await _windows(v, miners, 1)
        for role in (v, *miners):
            await role.node.aclose()
        return seen, lines

    seen, lines = run_virtual(scenario())
    for window, thetas in enumerate(seen):
        assert len(set(thetas.values())) == 1, f"window {window}: {thetas}"
    clock_lines = [line for line in lines if line.startswith("[CLOCK]")]
    assert len(clock_lines) == 2 and "behind" in clock_lines[0] and "ahead of" in clock_lines[1], lines
    late = [line for line in lines if line.startswith("commitment deadline passed")]
    assert late and all("s ahead of the chain's: synchronise it" in line for line in late), late


def _published(bucket_dir: Path) -> dict[str, bytes]:
    """Every object of a past window in the lead's bucket (not the pointers that move on: the peer lists'
    index, checkpoints' latest.json)."""
    return {str(p.relative_to(bucket_dir)): p.read_bytes() for p in bucket_dir.rglob("*") if p.is_file()
            and "/checkpoint/" not in f"/{p.relative_to(bucket_dir)}" and p.name != "index.json"}


@pytest.mark.slow(seconds=5)
def test_a_lead_restarted_on_an_empty_directory_replays_its_history_and_rewrites_nothing(tmp_path):
    subnet = Subnet.create(tmp_path, {"lead": 100.0, "m0": 0.0, "m1": 0.0}, checkpoint_frequency=2)
    lead_bucket = tmp_path / "buckets" / "lead"

    async def scenario():
        v = Validator(await subnet.node("lead"))
        miners = [Miner(await subnet.node(name)) for name in ("m0", "m1")]
        for role in (v, *miners):
            await role.start()
        await _windows(v, miners, 7)
        await v.checkpoints.wait()
        before = _published(lead_bucket)
        windows = sorted(int(p.parent.name) for p in (lead_bucket / checkpoint_prefix()).glob("*/manifest.json"))
        assert len(windows) >= 2, windows
        # the lead's machine is lost, and the newest checkpoint's model file was torn in the bucket
        v.node.state_lock.release()
        await v.node.aclose()
        for path in Path(v.node.state_dir).glob("*"):
            if path.is_file():
                path.unlink()
        newest = lead_bucket / checkpoint_file_key(windows[-1], "model.safetensors")
        newest.write_bytes(newest.read_bytes()[:4096])
        v = Validator(await subnet.node("lead"))  # (starting a node resets the log handlers)
        with LogLines() as lines:
            await v.start()
        assert v.state.window == miners[0].state.window, (v.state.window, miners[0].state.window)
        assert same_parameters(parameters(v.node), parameters(miners[0].node)), "the lead rebuilt another θ"
        seen = await _windows(v, miners, 2)
        after = _published(lead_bucket)
        changed = [key for key, data in before.items() if key in after and after[key] != data]
        for role in (v, *miners):
            await role.node.aclose()
        return lines, seen, changed

    lines, seen, changed = run_virtual(scenario())
    assert not changed, f"published history was rewritten: {changed}"
    assert any("unusable" in line and "checkpoint" in line for line in lines), lines
    assert any("starts without its score book" in line for line in lines), lines
    assert all(len(set(t.values())) == 1 for t in seen), seen


@pytest.mark.slow(seconds=3)
def test_unreadable_history_never_restarts_the_run(tmp_path):
    """What a node reads at start, unreadable, is never taken for absent:
    - the lead's start window torn while it was down: back on its own state it catches up and leads on,
      names the object once, and publishes no new start window (it is never rewritten);
    - every checkpoint torn, the lead's state directory lost: it stops with one line naming the
      checkpoints and the fix (exit 8), and a joining miner waits instead of starting from θ_0;
    - no checkpoint left at all and the start window torn: the lead stops naming the start window and
      the fix, and a joining miner cannot restore either, never starting a run of its own."""
    from templar.comms.keys import start_window_key
    from templar.runtime.restore import ResyncError, restore

    subnet = Subnet.create(tmp_path, {"lead": 100.0, "m0": 0.0, "m1": 0.0}, checkpoint_frequency=2)
    lead_bucket = tmp_path / "buckets" / "lead"
    start = lead_bucket / start_window_key()

    async def restart(v: Validator) -> Validator:
        v.node.state_lock.release()
        await v.node.aclose()
        return Validator(await subnet.node("lead"))

    async def scenario():
        v = Validator(await subnet.node("lead"))
        m = Miner(await subnet.node("m0"))
        for role in (v, m):
            await role.start()
        await _windows(v, [m], 5)
        await v.checkpoints.wait()
        start.write_bytes(start.read_bytes()[:20])  # torn while the lead was down
        torn = start.read_bytes()
        v = await restart(v)
        with LogLines() as lines:
            await v.start()
            await _windows(v, [m], 1)
        assert start.read_bytes() == torn, "the start window was written over"
        assert [line for line in lines if f"our {start_window_key()} is unreadable" in line], lines
        await v.checkpoints.wait()
        # the lead's machine is lost and every checkpoint's model file torn
        for path in Path(v.node.state_dir).glob("*"):
            if path.is_file():
                path.unlink()
        for model in (lead_bucket / checkpoint_prefix()).glob("*/model.safetensors"):
            model.write_bytes(b"torn")
        v = await restart(v)
        with pytest.raises(LeadError, match=r"refusing to rebuild published history\. Fix: put an intact") as torn_ckpt:
            await v.start()
        joiner = await subnet.node("m1")
        with pytest.raises(ResyncError, match="unusable"):
            await restore(joiner)
        # ... and then no checkpoint at all
        for path in sorted((lead_bucket / checkpoint_prefix()).rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        v = await restart(v)
        with pytest.raises(LeadError, match=r"start_window\.json is unreadable .*Fix: restore") as torn_start:
            await v.start()
        with pytest.raises(ResyncError, match=r"start_window\.json is unreadable"):
            await restore(joiner)
        for node in (v.node, m.node, joiner):
            await node.aclose()
        return torn_ckpt.value, torn_start.value

    errors = run_virtual(scenario())
    assert all(e.exit_code == EXIT_HISTORY and "\n" not in str(e) for e in errors), errors
    assert start.read_bytes()[:20] == start.read_bytes(), "a new run was started over the torn start window"


def test_one_node_per_state_directory(tmp_path):
    """In one process the second start is refused with its exit code; a second *process* on the
    directory exits with that code and one line."""
    subnet = Subnet.create(tmp_path, {"lead": 100.0, "m0": 0.0})

    async def scenario():
        first = await subnet.node("m0")
        with pytest.raises(StateLockedError, match="in use by another node") as info:
            await subnet.node("m0")
        cmd = subnet.neuron_cmd("miner", "m0")
        proc = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True, timeout=120)
        await first.aclose()
        again = await subnet.node("m0")  # released: the directory is free again
        await again.aclose()
        return info.value, proc

    error, proc = asyncio.run(scenario())
    assert error.exit_code == EXIT_STATE_LOCKED
    assert proc.returncode == EXIT_STATE_LOCKED, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and "in use by another node" in errors[0] and "Traceback" not in proc.stderr


def _disk_failures(subnet: Subnet) -> tuple[list[str], BaseException | None]:
    async def scenario():
        v = Validator(await subnet.node("lead"))
        m = Miner(await subnet.node("m0"))
        stopped = None
        with LogLines() as lines:  # (after the nodes started: starting a node resets the log handlers)
            try:
                for role in (v, m):
                    await role.start()
                await _windows(v, [m], 5)
            except StateDiskError as exc:
                stopped = exc
        for node in (v.node, m.node):
            await node.aclose()
        return list(lines), stopped

    return run_virtual(scenario())


def test_a_file_size_limit_is_one_line_per_window_then_its_own_exit(tmp_path):
    subnet = Subnet.create(tmp_path, {"lead": 100.0, "m0": 0.0})
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    try:
        # the miner's state file (θ, error feedback and the inner AdamW's moments: 1.6 MB on micro-1k)
        # cannot be written; the lead's (0.4 MB), its checkpoints (0.4 MB), the records, logs and pages
        # can. Python ignores SIGXFSZ, so writes fail with EFBIG.
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))
        lines, stopped = _disk_failures(subnet)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    saves = [line for line in lines if line.startswith("cannot write the node's state")]
    assert saves and all("\n" not in line and "state.safetensors" in line for line in saves), lines
    assert any("errno 27 (EFBIG)" in line for line in saves), saves
    assert isinstance(stopped, StateDiskError) and stopped.exit_code == EXIT_STATE_DISK, stopped


def test_a_full_filesystem_is_one_line_per_window_then_its_own_exit(tmp_path):
    """The miner's state directory on a filesystem that fills up (a real tmpfs of 2 MiB)."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs needs privileges this machine does not give: {done.stderr.decode()[:120]}")
    try:
        subnet = Subnet.create(tmp_path, {"lead": 100.0, "m0": 0.0})
        real = subnet.args

        def args(name, *extra):
            parsed = real(name, *extra)
            if name == "m0":
                parsed.state_dir = mount / "m0"
            return parsed

        subnet.args = args
        lines, stopped = _disk_failures(subnet)
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
    saves = [line for line in lines if line.startswith("cannot write the node's state")]
    assert saves and any("errno 28 (ENOSPC)" in line for line in saves), lines
    assert isinstance(stopped, StateDiskError), stopped


def test_a_miner_that_started_before_the_lead_skips_the_windows_before_the_run_start(tmp_path):
    """A miner up before the lead has no start window to read and takes its own current window as the
    run's start; the lead then starts the run a window later. The window in between never has an
    update: the miner moves past it (one `[SYNC]` line) and holds the lead's θ, instead of waiting for
    inputs the lead will never publish."""
    subnet = Subnet.create(tmp_path, {"lead": 100.0, "m0": 0.0})  # (the process localnet's miners, at times)

    async def scenario():
        miner = Miner(await subnet.node("m0"))
        await miner.start()
        early = miner.state.window + 1  # the miner's idea of the run's first window
        node = miner.node
        await node.clock.sleep_until(node.clock.times(early + 1).start)
        v = Validator(await subnet.node("lead"))
        await v.start()
        assert v.state.window + 1 > early  # the lead's run starts later than the miner thought
        seen = await _windows(v, [miner], 2)
        assert miner.state.window == v.state.window, (miner.state.window, v.state.window)  # was stuck at early - 1
        assert all(len(set(thetas.values())) == 1 for thetas in seen), seen
        await asyncio.gather(v.node.aclose(), miner.node.aclose())

    run_virtual(scenario())


def test_a_miner_still_behind_after_its_join_says_so_and_is_active_only_once_caught_up(tmp_path, faults):
    """A miner joins while the lead's inputs of the last window cannot be read (its route to the lead's
    bucket resets): its catch-up stops before that window, and it says once that it is behind and what it
    waits for, never `Active`; once the record can be read, it catches up and says its phase."""
    from tests.faults import Fault

    from templar.comms.keys import inputs_key

    subnet = Subnet.create(tmp_path, {"lead": 100.0, "m0": 0.0, "late": 0.0}, checkpoint_frequency=100)

    async def scenario():
        v = Validator(await subnet.node("lead"))
        m = Miner(await subnet.node("m0"))
        for role in (v, m):
            await role.start()
        await _windows(v, [m], 3)
        subnet.open_bucket = faults.open_bucket  # the late joiner's buckets, the lead's included
        late = Miner(await subnet.node("late"))
        reset = faults.add(Fault.ERROR, ops={"get"}, keys=inputs_key(v.state.window), message="connection reset")
        with LogLines(level="INFO") as lines:
            await late.start()
            stuck = list(lines)
            faults.remove(reset)
            await late.join(own_state=False)
        for role in (v, m, late):
            await role.node.aclose()
        return stuck, lines[len(stuck):], late, v.state

    stuck, after, late, lead = run_virtual(scenario())
    last = lead.window
    said = [line for line in stuck if line.startswith("[SYNC] Still")]
    assert len(said) == 1 and f"waiting for the update of window {last}" in said[0], stuck
    assert not [line for line in stuck if "Active" in line or "Warm-up:" in line], stuck
    assert any(line.startswith("[SYNC] Warm-up: training") for line in after), after
    assert late.state.window >= last and late.state.global_step == lead.global_step  # the lead's model


def _checkpoints(bucket_dir: Path) -> list[int]:
    """The windows of the checkpoints in a validator's bucket."""
    return sorted(int(p.parent.name) for p in (bucket_dir / checkpoint_prefix()).glob("*/manifest.json"))


@pytest.mark.slow(seconds=8)
def test_a_validator_that_comes_to_head_the_succession_checkpoints_at_once_and_a_joiner_syncs(tmp_path):
    """The head of the succession dies, still staked: the next validator leads each boundary of the cadence
    from the second slot, and publishes no checkpoint (the head's still passes a joiner's check: its window
    is one the head led by the order of now). Then stake makes that validator the head: from its first
    boundary under the new order it publishes one at once, not `checkpoint_frequency` windows later. A
    miner that joins then replays by the order of now, under which the former head's windows (and the
    ones the new head led from the second slot) read as led by nobody: it loads the new head's checkpoint
    and holds the run's θ (without it, it could not sync: 'checkpoint 0 of uid 1 is not the run's: uid 1
    did not lead window 0', and 'Cannot restore the run's state yet' every window)."""
    subnet = Subnet.create(tmp_path, {"lead": 100.0, "v1": 50.0, "m0": 0.0, "m1": 0.0}, checkpoint_frequency=1000)
    cadence = load_hparams(subnet.hparams).windows.lead_cadence

    async def scenario():
        lead, v1 = [Validator(await subnet.node(name)) for name in ("lead", "v1")]
        m0 = Miner(await subnet.node("m0"))
        live = [lead, v1, m0]
        for role in live:
            await role.start()

        async def windows_to(last: int) -> None:
            while m0.state.window < last:
                w = m0.state.window + 1
                await asyncio.gather(*(role.run_window(w) for role in live))

        first = m0.state.window + 1
        boundary = -(-first // cadence) * cadence  # the first boundary of the cadence the run reaches
        await windows_to(boundary + cadence + 1)  # the head leads two boundaries
        live.remove(lead)  # and dies: v1 leads the next two boundaries from slot 1
        await windows_to(boundary + 3 * cadence + 1)
        subnet.dev.fund("v1", 200.0)
        with subnet.dev.connect("v1") as chain:
            chain.add_stake(150.0)  # v1 now heads the order
        takeover = boundary + 4 * cadence
        await windows_to(takeover + 1)
        await v1.checkpoints.wait()
        led = {w: (d.lead.hotkey, d.slot) for w, d in m0.node.leads.decisions.items() if d.lead is not None}
        m1 = Miner(await subnet.node("m1"))
        async with asyncio.timeout(3 * m0.hp.windows.window_seconds):
            await m1.start()
        joined = m1.state.window
        thetas = {name: theta(role.node) for name, role in (("v1", v1), ("m0", m0), ("m1", m1))}
        for role in (lead, v1, m0, m1):
            await role.node.aclose()
        return boundary, takeover, led, (joined, m0.state.window), thetas

    boundary, takeover, led, (joined, last), thetas = run_virtual(scenario())
    hotkey = {name: subnet.wallets[name].hotkey for name in ("lead", "v1")}
    assert [led[boundary + k * cadence] for k in range(5)] == [
        (hotkey["lead"], 0), (hotkey["lead"], 0), (hotkey["v1"], 1), (hotkey["v1"], 1), (hotkey["v1"], 0)]
    # the head: window 0's regular checkpoint (a multiple of checkpoint_frequency) and none at the boundary it
    # led again; v1: none while the head's passed, one at its first boundary as the head
    assert _checkpoints(tmp_path / "buckets" / "lead") == [boundary] == [0]
    assert _checkpoints(tmp_path / "buckets" / "v1") == [takeover]
    assert joined == last and len(set(thetas.values())) == 1, (joined, last, thetas)
