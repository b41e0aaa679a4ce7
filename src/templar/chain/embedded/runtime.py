"""The embedded chain's state transition function: the few extrinsics a subnet needs.

Each handler mirrors the checks of the matching subtensor pallet call closely enough that
the SDK's error mapping sees the same error *names* a real node would report
(`SettingWeightsTooFast`, `HotKeyAlreadyRegisteredInSubNet`, ...). Simplifications, all
deliberate for a single-machine dev chain: no fees, alpha priced 1:1 against TAO with no
pool or slippage, no epochs (validator permits follow stake at once), no neuron pruning, no
drand (so commit-reveal and timelocked commitments are unsupported), no commitment space
accounting. Anything not listed in `HANDLERS` is refused with a message naming the call.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from templar.chain.embedded.store import (
    RAO_PER_TAO,
    ChainSpec,
    account,
    neuron_rows,
    owner_of,
    subnet_row,
    uid_of,
    validator_permits,
)

U16_MAX = 65535
MAX_COMMITMENT_FIELDS = 3  # Commitments::MaxFields in the current runtime
MAX_RAW_BYTES = 128  # the largest `RawN` variant


class DispatchError(Exception):
    """A call failed on chain; `name` is the pallet error name when one applies."""

    def __init__(self, name: str | None, message: str) -> None:
        super().__init__(message)
        self.name = name
        self.message = message


@dataclass(frozen=True)
class Context:
    """Where a call runs: inside the caller's write transaction, at one block, for one signer."""

    conn: sqlite3.Connection
    spec: ChainSpec
    block: int
    signer: str


Events = list[dict[str, Any]]


def event(module: str, name: str, attributes: Any) -> dict[str, Any]:
    """A decoded `System.Events` record in the shape the SDK's receipt parser reads."""
    return {"event": {"module_id": module, "event_id": name, "attributes": attributes}}


def _int(params: dict, name: str, *, lo: int = 0, hi: int = 2**64 - 1) -> int:
    value = params.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise DispatchError(None, f"parameter {name!r} must be an integer in [{lo}, {hi}], got {value!r}")
    return value


def _address(params: dict, name: str) -> str:
    value = params.get(name)
    if not isinstance(value, str) or not 40 <= len(value) <= 60:
        raise DispatchError(None, f"parameter {name!r} must be an ss58 address, got {value!r}")
    return value


def _subnet(ctx: Context, netuid: int):
    subnet = subnet_row(ctx.conn, netuid)
    if subnet is None:
        raise DispatchError("SubnetNotExists", f"subnet {netuid} does not exist on this chain")
    return subnet


def _debit(ctx: Context, address: str, rao: int, error: str, what: str) -> None:
    free, _ = account(ctx.conn, address)
    if free < rao:
        raise DispatchError(
            error,
            f"{what} needs {rao / RAO_PER_TAO:.9f} TAO but {address} has {free / RAO_PER_TAO:.9f} TAO free",
        )
    ctx.conn.execute("UPDATE accounts SET free = free - ? WHERE address = ?", (rao, address))


def _claim_hotkey(ctx: Context, hotkey: str) -> None:
    """Bind a hotkey to the signing coldkey, or fail if another coldkey owns it."""
    owner = owner_of(ctx.conn, hotkey)
    if owner is None:
        ctx.conn.execute("INSERT INTO owners (hotkey, coldkey) VALUES (?, ?)", (hotkey, ctx.signer))
    elif owner != ctx.signer:
        raise DispatchError(
            "NonAssociatedColdKey",
            f"hotkey {hotkey} belongs to coldkey {owner}, not to the signer {ctx.signer}",
        )


def _append_neuron(ctx: Context, netuid: int, hotkey: str) -> int:
    uid = ctx.conn.execute("SELECT COUNT(*) FROM neurons WHERE netuid = ?", (netuid,)).fetchone()[0]
    ctx.conn.execute(
        "INSERT INTO neurons (netuid, uid, hotkey, coldkey, registered_at, last_update) "
        "VALUES (?, ?, ?, ?, ?, 0)",
        (netuid, uid, hotkey, owner_of(ctx.conn, hotkey), ctx.block),
    )
    return int(uid)


# -- SubtensorModule -------------------------------------------------------------------------


def register_network(ctx: Context, params: dict) -> Events:
    """Create a subnet owned by the signer; its hotkey becomes uid 0 (as on subtensor)."""
    hotkey = _address(params, "hotkey")
    _claim_hotkey(ctx, hotkey)
    _debit(ctx, ctx.signer, ctx.spec.subnet_lock_rao, "NotEnoughBalanceToStake", "subnet registration")
    taken = {n for (n,) in ctx.conn.execute("SELECT netuid FROM subnets")}
    netuid = ctx.spec.first_netuid
    while netuid in taken:
        netuid += 1
    if netuid > U16_MAX:
        raise DispatchError("SubnetLimitReached", "no netuid left on this chain")
    s = ctx.spec
    ctx.conn.execute(
        "INSERT INTO subnets (netuid, owner_coldkey, owner_hotkey, registered_at, locked, tempo, "
        "weights_rate_limit, min_allowed_weights, max_weights_limit, max_uids, max_validators, burn, "
        "commit_reveal, name, symbol) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?)",
        (
            netuid,
            ctx.signer,
            hotkey,
            ctx.block,
            s.subnet_lock_rao,
            s.tempo,
            s.weights_rate_limit,
            s.min_allowed_weights,
            s.max_weights_limit,
            s.max_uids,
            s.max_validators,
            s.burn_rao,
            f"embedded-{netuid}",
            "α",
        ),
    )
    _append_neuron(ctx, netuid, hotkey)
    return [event("SubtensorModule", "NetworkAdded", [netuid, 0])]


def burned_register(ctx: Context, params: dict) -> Events:
    """Give a hotkey the next uid on a subnet, paying the subnet's burn from the signer."""
    netuid, hotkey = _int(params, "netuid", hi=U16_MAX), _address(params, "hotkey")
    if netuid == 0:
        raise DispatchError("RegistrationNotPermittedOnRootSubnet", "use root_register for netuid 0")
    subnet = _subnet(ctx, netuid)
    if uid_of(ctx.conn, netuid, hotkey) is not None:
        raise DispatchError(
            "HotKeyAlreadyRegisteredInSubNet", f"hotkey {hotkey} is already registered on subnet {netuid}"
        )
    _claim_hotkey(ctx, hotkey)
    count = ctx.conn.execute("SELECT COUNT(*) FROM neurons WHERE netuid = ?", (netuid,)).fetchone()[0]
    if count >= subnet.max_uids:
        raise DispatchError(
            None,
            f"subnet {netuid} is full ({subnet.max_uids} uids); the embedded chain does not prune neurons",
        )
    _debit(ctx, ctx.signer, subnet.burn, "NotEnoughBalanceToStake", "registration")
    uid = _append_neuron(ctx, netuid, hotkey)
    return [event("SubtensorModule", "NeuronRegistered", [netuid, uid, hotkey])]


def add_stake(ctx: Context, params: dict) -> Events:
    """Stake free TAO onto a hotkey as alpha at a fixed 1:1 price (`add_stake[_limit]`)."""
    netuid, hotkey = _int(params, "netuid", hi=U16_MAX), _address(params, "hotkey")
    amount = _int(params, "amount_staked", lo=1)
    _subnet(ctx, netuid)
    if owner_of(ctx.conn, hotkey) is None:
        raise DispatchError("HotKeyAccountNotExists", f"hotkey {hotkey} has no owner on this chain")
    if "limit_price" in params and _int(params, "limit_price") < RAO_PER_TAO:
        raise DispatchError("SlippageTooHigh", "the embedded chain prices alpha at exactly 1 TAO")
    _debit(ctx, ctx.signer, amount, "NotEnoughBalanceToStake", "staking")
    ctx.conn.execute(
        "INSERT INTO stakes (netuid, hotkey, coldkey, alpha) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (netuid, hotkey, coldkey) DO UPDATE SET alpha = alpha + excluded.alpha",
        (netuid, hotkey, ctx.signer, amount),
    )
    return [event("SubtensorModule", "StakeAdded", [ctx.signer, hotkey, amount, amount, netuid])]


def set_mechanism_weights(ctx: Context, params: dict) -> Events:
    """Store a validator's weight row, enforcing permit, shape and the weights rate limit."""
    netuid = _int(params, "netuid", hi=U16_MAX)
    if _int(params, "mecid", hi=255) != 0:
        raise DispatchError("MechanismDoesNotExist", "the embedded chain has only mechanism 0")
    dests, values = params.get("dests"), params.get("weights")
    if not isinstance(dests, list | tuple) or not isinstance(values, list | tuple):
        raise DispatchError(None, "dests and weights must be lists")
    for item in (*dests, *values):
        if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item <= U16_MAX:
            raise DispatchError(None, f"weights and uids must be u16 integers, got {item!r}")
    subnet = _subnet(ctx, netuid)
    if subnet.commit_reveal:
        raise DispatchError("CommitRevealEnabled", f"subnet {netuid} requires commit-reveal weights")
    uid = uid_of(ctx.conn, netuid, ctx.signer)
    if uid is None:
        raise DispatchError(
            "HotKeyNotRegisteredInSubNet", f"hotkey {ctx.signer} is not registered on subnet {netuid}"
        )
    if len(dests) != len(values):
        raise DispatchError("WeightVecNotEqualSize", "dests and weights differ in length")
    if len(set(dests)) != len(dests):
        raise DispatchError("DuplicateUids", "a uid appears twice in dests")
    neurons = neuron_rows(ctx.conn, netuid)
    if any(d >= len(neurons) for d in dests):
        raise DispatchError("UidVecContainInvalidOne", f"dests name a uid >= {len(neurons)}")
    self_only = list(dests) == [uid]
    if not self_only:
        if not validator_permits(neurons, subnet.max_validators)[uid]:
            raise DispatchError(
                "NeuronNoValidatorPermit",
                f"uid {uid} holds no validator permit on subnet {netuid} (stake it)",
            )
        if len(dests) < subnet.min_allowed_weights:
            raise DispatchError(
                "WeightVecLengthIsLow", f"subnet {netuid} needs at least {subnet.min_allowed_weights} weights"
            )
        total = sum(values)
        if total and max(values) * U16_MAX > subnet.max_weights_limit * total:
            raise DispatchError("MaxWeightExceeded", "a single weight exceeds max_weights_limit")
    last = neurons[uid].last_update
    if last > 0 and ctx.block - last < subnet.weights_rate_limit:
        wait = subnet.weights_rate_limit - (ctx.block - last)
        raise DispatchError(
            "SettingWeightsTooFast",
            f"weights on subnet {netuid} were last set at block {last}; the rate limit "
            f"is {subnet.weights_rate_limit} blocks. Retry in ~{wait} blocks.",
        )
    top = max(values, default=0)
    row = [(d, round(v * U16_MAX / top)) for d, v in zip(dests, values, strict=True) if v and top]
    ctx.conn.execute(
        "INSERT INTO weights (netuid, uid, row) VALUES (?, ?, ?) "
        "ON CONFLICT (netuid, uid) DO UPDATE SET row = excluded.row",
        (netuid, uid, json.dumps(row)),
    )
    ctx.conn.execute(
        "UPDATE neurons SET last_update = ? WHERE netuid = ? AND uid = ?", (ctx.block, netuid, uid)
    )
    return [event("SubtensorModule", "WeightsSet", [netuid, uid])]


# -- Commitments -----------------------------------------------------------------------------


def _raw_field(entry: Any) -> dict[str, str]:
    """Validate one `Data::RawN` field and return its stored (decoded-RPC) form."""
    if not isinstance(entry, dict) or len(entry) != 1:
        raise DispatchError(
            None, f"a commitment field must be a one-key dict like {{'Raw4': b'...'}}, got {entry!r:.80}"
        )
    ((variant, payload),) = entry.items()
    if not (isinstance(variant, str) and variant.startswith("Raw") and variant[3:].isdigit()):
        raise DispatchError(
            None,
            f"the embedded chain stores only Raw commitment fields, not {variant!r} "
            "(no drand: timelocked commitments need a real node)",
        )
    size = int(variant[3:])
    if isinstance(payload, str):
        payload = bytes.fromhex(payload[2:]) if payload.startswith("0x") else payload.encode()
    if isinstance(payload, list):
        payload = bytes(payload)
    if not isinstance(payload, bytes | bytearray) or len(payload) != size:
        raise DispatchError(None, f"{variant} needs exactly {size} bytes of payload")
    if size > MAX_RAW_BYTES:
        raise DispatchError(
            None, f"{variant} is not a Data variant: raw fields hold at most {MAX_RAW_BYTES} bytes"
        )
    return {variant: "0x" + bytes(payload).hex()}


def set_commitment(ctx: Context, params: dict) -> Events:
    """Publish a registered hotkey's commitment (`info = {"fields": [[field, ...]]}`)."""
    netuid = _int(params, "netuid", hi=U16_MAX)
    _subnet(ctx, netuid)
    if uid_of(ctx.conn, netuid, ctx.signer) is None:
        raise DispatchError("AccountNotAllowedCommit", f"{ctx.signer} is not registered on subnet {netuid}")
    info = params.get("info")
    outer = info.get("fields") if isinstance(info, dict) else None
    if not (isinstance(outer, list | tuple) and len(outer) == 1 and isinstance(outer[0], list | tuple)):
        raise DispatchError(None, "info must be {'fields': [[field, ...]]} (a BoundedVec of Data)")
    if len(outer[0]) > MAX_COMMITMENT_FIELDS:
        raise DispatchError(
            "TooManyFieldsInCommitmentInfo",
            f"{len(outer[0])} fields; at most {MAX_COMMITMENT_FIELDS} allowed",
        )
    stored = [_raw_field(entry) for entry in outer[0]]
    ctx.conn.execute(
        "INSERT INTO commitments (netuid, hotkey, block, deposit, fields) VALUES (?, ?, ?, 0, ?) "
        "ON CONFLICT (netuid, hotkey) DO UPDATE SET block = excluded.block, fields = excluded.fields",
        (netuid, ctx.signer, ctx.block, json.dumps(stored)),
    )
    return [event("Commitments", "Commitment", [netuid, ctx.signer])]


HANDLERS: dict[tuple[str, str], Callable[[Context, dict], Events]] = {
    ("SubtensorModule", "register_network"): register_network,
    ("SubtensorModule", "burned_register"): burned_register,
    ("SubtensorModule", "add_stake"): add_stake,
    ("SubtensorModule", "add_stake_limit"): add_stake,
    ("SubtensorModule", "set_mechanism_weights"): set_mechanism_weights,
    ("Commitments", "set_commitment"): set_commitment,
}


def apply(ctx: Context, module: str, function: str, params: dict) -> Events:
    """Run one call; raises DispatchError (the caller rolls back the call's writes)."""
    handler = HANDLERS.get((module, function))
    if handler is None:
        supported = ", ".join(f"{m}.{f}" for m, f in HANDLERS)
        raise DispatchError(
            None,
            f"the embedded chain does not implement {module}.{function}; "
            f"it supports {supported} (plus MevShield.submit_encrypted)",
        )
    return handler(ctx, params)
