"""Checks of who the node is on chain: hparams, wallet, the chain and this machine's clock,
registration and stake, the subnet's weight settings, and the run the lead publishes."""

from __future__ import annotations

import asyncio
import dataclasses

from templar.chain import ChainError, connect, is_miner, load_wallet, succession_of
from templar.comms.exchange import RecordError, StartWindow, parse_record
from templar.comms.keys import start_window_key
from templar.core.config import HParamsError, load_hparams
from templar.doctor.context import Doctor
from templar.doctor.result import CheckResult, failed, ok, skipped, warning
from templar.storage import ObjectNotFound, StorageError, open_bucket
from templar.storage.locator import BucketLocator, LocatorError

SMALL_MODEL = 50_000_000
"""Parameters below which a CPU can do a window's work (the tiny presets)."""


async def check_hparams(d: Doctor) -> CheckResult:
    """The hyperparameter file loads and validates; its digest names the run."""
    try:
        d.hp = load_hparams(d.args.hparams)
    except HParamsError as exc:
        return failed("hparams", str(exc), "fix the key named, or pass --hparams with the run's file")
    from templar.tools.sizing import window_sizing

    d.sizing = await asyncio.to_thread(window_sizing, d.hp)
    return ok("hparams", f"{d.hp.name}: run digest {d.hp.digest()[:16]}…, {d.sizing['parameters'] / 1e6:,.1f}M "
                         f"parameters, {d.sizing['window_seconds']:.0f}s windows", digest=d.hp.digest())


async def check_wallet(d: Doctor) -> CheckResult:
    """The wallet's hotkey and public coldkey are on disk (nothing is created)."""
    a = d.args
    try:
        d.wallet = await asyncio.to_thread(load_wallet, a.wallet_name, a.wallet_hotkey, a.wallet_path)
    except ChainError as exc:
        return failed("wallet", str(exc), f"create them: {d.wallet_hint()}")
    hotkey = d.wallet.hotkey_file.path
    return ok("wallet", f"{a.wallet_name}/{a.wallet_hotkey}: hotkey and coldkeypub present ({hotkey})")


async def check_chain(d: Doctor) -> CheckResult:
    """The chain answers within the timeout; its block time; this machine's clock against the
    timestamps of its blocks (every window's deadline comes from them: a clock off by more than
    `clock_skew_seconds` uploads outside the put window)."""
    a = d.args
    try:
        chain = await asyncio.to_thread(
            connect, network=a.subtensor_network, chain_endpoint=a.subtensor_chain_endpoint, netuid=a.netuid,
            wallet_name=None, read_timeout=d.timeout, **({"now": d.chain_now} if d.chain_now else {}))
        d.chain = chain.for_wallet(d.wallet) if d.wallet is not None else chain
        block_time = await asyncio.to_thread(lambda: d.chain.block_time)
        skew, spread, block = await _clock_skew(d, block_time)
    except (ChainError, ValueError) as exc:
        return failed("chain", f"{a.subtensor_network}: {exc}", "check --subtensor.network / "
                      "--subtensor.chain_endpoint and this machine's network")
    data = {"block": block, "block_time": block_time, "skew_seconds": round(skew, 3),
            "uncertainty_seconds": round(spread, 3)}
    line = f"{a.subtensor_network} at block {block}, {block_time:g}s blocks; clock {skew:+.2f}s (±{spread:.2f}s)"
    tolerance = d.hp.windows.clock_skew_seconds if d.hp else 2.0
    fix = "synchronise this machine's clock (chrony or systemd-timesyncd with NTP)"
    if abs(skew) - spread > tolerance:
        return failed("chain", f"{line}: beyond the run's clock_skew_seconds ({tolerance:g}s)", fix, **data)
    if abs(skew) > tolerance / 2:
        return warning("chain", f"{line}: over half the run's clock_skew_seconds ({tolerance:g}s)", fix, **data)
    if d.hp and abs(block_time - d.hp.windows.block_time) > 0.1 * d.hp.windows.block_time:
        return warning("chain", f"{line}; hparams assume {d.hp.windows.block_time:g}s blocks",
                       "use the run's hparams for this network (window lengths are counted in blocks)", **data)
    return ok("chain", line, **data)


async def _clock_skew(d: Doctor, block_time: float) -> tuple[float, float, int]:
    """(our clock minus the chain's, uncertainty, block): the moment a new block appears is compared
    with its timestamp; polling every few hundred ms bounds the uncertainty (at most 2 block times).
    On a real network the block's way to our endpoint (a few hundred ms) reads as our clock ahead."""
    chain = d.chain
    poll = max(0.01, min(0.25, block_time / 8))
    first, _ = await asyncio.to_thread(chain.head)
    deadline = d.now() + 2 * block_time + 2.0
    before = d.now()
    while d.now() < deadline:
        await asyncio.sleep(poll)
        block, stamp = await asyncio.to_thread(chain.head)
        seen = d.now()
        if block > first:
            # the block began between our previous look and this one
            return (before + seen) / 2 - stamp, (seen - before) / 2, block
        before = seen
    block, stamp = await asyncio.to_thread(chain.head)
    # no new block: the head began at most a block ago (or the chain is stalled)
    return d.now() - stamp - block_time / 2, block_time / 2, block


async def check_registration(d: Doctor) -> CheckResult:
    """Our hotkey has a uid on the netuid; a validator also needs stake and its permit. A miner may hold
    both (stake anyone put on it, its own earnings): only a commitment that declares a validator keeps
    validators from scoring it, and the miner commits its bucket bare when it starts."""
    if d.chain is None or d.wallet is None:
        return skipped("registration", "needs the wallet and the chain")
    netuid = d.args.netuid
    try:
        d.neurons = await asyncio.to_thread(d.chain.metagraph)
    except ChainError as exc:
        return failed("registration", f"cannot read subnet {netuid}: {exc}", "check --netuid")
    me = next((n for n in d.neurons if n.hotkey == d.chain.hotkey), None)
    if me is None:
        return failed("registration", f"hotkey {d.chain.hotkey} is not registered on netuid {netuid} "
                      f"of {d.network}", d.register_hint())
    d.uid = me.uid
    # The chain's rule, as every node applies it; a validator commits its bucket, declared, when it
    # starts, so it is counted as having done so.
    neurons = d.neurons
    if d.role == "validator" and (me.commitment is None or not me.validates):
        neurons = [dataclasses.replace(n, commitment=n.commitment or "(committed at start)", validates=True)
                   if n is me else n for n in neurons]
    elif d.role != "validator" and me.validates:  # a miner commits its bucket bare when it starts
        neurons = [dataclasses.replace(n, validates=False) if n is me else n for n in neurons]
    order = succession_of(neurons)
    slot = next((i for i, n in enumerate(order) if n.uid == me.uid), None)
    lead = order[0] if order else None
    data = {"uid": me.uid, "stake": me.stake, "permit": me.validator_permit, "lead": slot == 0, "slot": slot}
    line = f"uid {me.uid} on netuid {netuid}, stake {me.stake:,.2f} τ"
    if d.role == "validator":
        if me.stake <= 0 or not me.validator_permit or lead is None:
            return failed("registration", f"{line}, {'a' if me.validator_permit else 'no'} validator permit: "
                          "weights would be refused", "stake on this hotkey (btcli stake add; on a dev chain "
                          "`templar chain register --stake 100`) and wait for the permit", **data)
        slots = d.hp.windows.lead_slots if d.hp is not None else None
        if slot == 0:
            role = "first of the succession (most stake): it leads the run"
        elif slot is not None and (slots is None or slot < slots):
            role = f"slot {slot} of the succession: it leads a window whose earlier slots publish nothing; " \
                   f"lead is uid {lead.uid}"
        else:
            role = f"lead is uid {lead.uid}"
        return ok("registration", f"{line}, validator permit; {role}", **data)
    if not is_miner(me):
        return ok("registration", f"{line}; its commitment declares a validator: the miner commits its bucket as a "
                  "miner's when it starts, and validators score it from then on", **data)
    return ok("registration", line, **data)


async def check_weights_settings(d: Doctor) -> CheckResult:
    """Validators: the subnet's weights rate limit against the run's weights cadence, and
    commit-reveal (weights then show on chain only after their reveal)."""
    if d.role != "validator":
        return skipped("weights-settings", "validators only")
    if d.chain is None or d.hp is None:
        return skipped("weights-settings", "needs the chain and hparams")
    try:
        s = await asyncio.to_thread(d.chain.weights_settings)
    except ChainError as exc:
        return failed("weights-settings", f"cannot read the subnet's weight settings: {exc}", "check --netuid")
    w = d.hp.windows
    cadence = w.windows_per_weights * w.blocks_per_window
    data = {"rate_limit": s.rate_limit, "commit_reveal": s.commit_reveal, "cadence_blocks": cadence,
            "min_allowed_weights": s.min_allowed_weights}
    line = (f"rate limit {s.rate_limit} blocks, weights every {cadence} blocks; commit-reveal "
            f"{'on' if s.commit_reveal else 'off'}")
    if s.commit_reveal and d.embedded:
        return failed("weights-settings", f"{line}: the embedded chain cannot reveal commits (no drand)",
                      "turn commit-reveal off on the dev chain (ChainStore.set_subnet_params(commit_reveal=0))", **data)
    if s.rate_limit > cadence:
        return warning("weights-settings", f"{line}: some weights windows will wait for the rate limit",
                       "ask the subnet owner to lower weights_rate_limit, or raise windows_per_weights", **data)
    miners = sum(is_miner(n) for n in d.neurons)
    if d.neurons and s.min_allowed_weights > miners:
        return warning("weights-settings", f"{line}: the subnet needs {s.min_allowed_weights} weights and has {miners} "
                       "miners", "weights are refused until enough miners are scored", **data)
    note = "; weights show on chain after their reveal" if s.commit_reveal else ""
    return ok("weights-settings", line + note, **data)


async def check_lead_run(d: Doctor) -> CheckResult:
    """Our hparams are the lead's run: the run digest in the lead's published start window must be
    ours, or every payload we sign is refused as `wrong_run` and we aggregate nothing."""
    if d.chain is None or d.hp is None:
        return skipped("lead-run", "needs the chain and hparams")
    try:
        lead = await asyncio.to_thread(d.chain.lead_validator)
        locators = await asyncio.to_thread(d.chain.bucket_locators) if lead else {}
    except ChainError as exc:
        return failed("lead-run", f"cannot read the lead validator: {exc}", "check the chain")
    ours = d.hp.digest()
    if lead is None:
        me = next((n for n in d.neurons if n.hotkey == d.hotkey), None)
        if d.role == "validator" and me is not None and me.validator_permit and me.stake > 0:
            return ok("lead-run", "no validator has committed a validator's bucket yet: this one leads the run once it starts, "
                      f"and its hparams define it ({ours[:16]}…)", run=ours)
        return warning("lead-run", "no lead validator yet (none with a validator permit, stake and a bucket "
                       "committed as a validator's)", "wait for the subnet's lead")
    if d.hotkey == lead.hotkey:
        return ok("lead-run", f"this validator is the lead: its hparams define the run ({ours[:16]}…)", run=ours)
    raw = locators.get(lead.hotkey)
    if raw is None:
        return warning("lead-run", f"the lead (uid {lead.uid}) has committed no bucket yet", "wait for it to start")
    try:
        bucket = open_bucket(BucketLocator.parse(raw), allow_private=not d.public)
    except LocatorError as exc:
        return warning("lead-run", f"the lead's bucket is unusable: {exc}", "tell the subnet owner")
    try:
        async with bucket:
            data = await bucket.get(start_window_key(), max_bytes=4096, timeout=d.timeout)
    except ObjectNotFound:
        return warning("lead-run", f"the lead (uid {lead.uid}) has not published its run yet", "start after the lead")
    except StorageError as exc:
        return warning("lead-run", f"the lead's bucket did not answer: {exc}", "retry later; tell the subnet owner")
    try:  # the nodes' own reader of it: `{"netuid": Infinity}` or deep nesting made this check fail as a bug
        record: StartWindow = parse_record(data, StartWindow, "the lead's start_window.json")
    except RecordError:
        return warning("lead-run", "the lead's start_window.json is not a run record", "tell the subnet owner")
    theirs, netuid = record.run, record.netuid
    if theirs != ours or netuid != d.args.netuid:
        return failed("lead-run", f"the lead runs {theirs[:16]}… on netuid {netuid}; these hparams are {ours[:16]}…: every "
                      "payload would be refused as wrong_run", "use the run's hparams file (same digest as the "
                      "lead's: `templar hparams FILE` prints it)", lead_run=theirs, run=ours)
    return ok("lead-run", f"same run as the lead (uid {lead.uid}): {ours[:16]}…", run=ours)


def small_model(d: Doctor) -> bool:
    return d.sizing is not None and d.sizing["parameters"] < SMALL_MODEL
