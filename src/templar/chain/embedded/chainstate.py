"""Chain state as the SDK reads it: storage items, maps and the metagraph runtime API.

Every function returns the *decoded* value shape bittensor's RPC backend hands to the SDK
(hex strings for raw bytes, lists of ints for byte vectors, plain ints for balances), so the
SDK's own decoders (`bittensor.metagraph`, `reads.*`) run unchanged over the embedded chain.
Anything not modelled raises the SDK's ChainError naming the item, never a silent None.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from bittensor.result import ChainError as SdkChainError

from templar.chain.embedded import epochs, store

MECHANISM_STRIDE = 4096  # storage index = mechid * 4096 + netuid (GLOBAL_MAX_SUBNET_COUNT)
U16_MAX = 65535

EPOCH_ITEMS = {
    "Incentive": "incentive",
    "Dividends": "dividends",
    "Consensus": "consensus",
    "Trust": "trust",
    "ValidatorTrust": "validator_trust",
    "Rank": "rank",
    "Emission": "emission",
}
"""Per-subnet vectors the Yuma epoch writes (`templar.chain.embedded.epochs`): u16 fractions, emission in rao."""


def epoch_column(conn: sqlite3.Connection, netuid: int, column: str) -> list[int]:
    """One epoch result per uid, as the chain stores it: PerU16 fractions, or rao for emission.

    Uids that registered after the last epoch (or whose hotkey changed since) read 0.
    """
    n = len(store.neuron_rows(conn, netuid))
    values = epochs.results(conn, netuid)
    scale = 1 if column == "emission" else U16_MAX
    return [round(values[uid][column] * scale) if uid in values else 0 for uid in range(n)]


def unsupported(what: str) -> SdkChainError:
    return SdkChainError(f"the embedded chain does not support {what}; use a real node for it")


def storage_value(conn: sqlite3.Connection, module: str, item: str, params: list, timestamp_ms: int) -> Any:
    """One storage item, as the RPC backend decodes it (`Timestamp.Now` is for the read's block)."""
    key = (module, item)
    if key == ("Timestamp", "Now"):
        return timestamp_ms
    if key == ("System", "Account"):
        free, nonce = store.account(conn, params[0])
        return {
            "nonce": nonce,
            "consumers": 0,
            "providers": 1,
            "sufficients": 0,
            "data": {"free": free, "reserved": 0, "frozen": 0, "flags": 0},
        }
    if key == ("Commitments", "CommitmentOf"):
        return store.commitment_record(conn, params[0], params[1])
    if key == ("Commitments", "RevealedCommitments"):
        return None  # no drand on the embedded chain: nothing is ever timelock-revealed
    if module != "SubtensorModule":
        raise unsupported(f"storage {module}.{item}")
    if item == "Uids":
        return store.uid_of(conn, params[0], params[1])
    if item == "Owner":
        return store.owner_of(conn, params[0])
    if item in ("LastUpdate", "ValidatorPermit", "Weights", "Keys"):
        return _per_uid(conn, item, params)
    if item in EPOCH_ITEMS:
        index = params[0]
        if index >= MECHANISM_STRIDE or store.subnet_row(conn, index) is None:
            return []
        return epoch_column(conn, index, EPOCH_ITEMS[item])
    subnet = store.subnet_row(conn, params[0]) if params else None
    if item == "NetworksAdded":
        return subnet is not None
    if subnet is None:
        if item in _SUBNET_ITEMS:
            return None  # absent subnet: the SDK treats None as "no such subnet"
        raise unsupported(f"storage SubtensorModule.{item}")
    if item in _SUBNET_ITEMS:
        return _SUBNET_ITEMS[item](subnet, conn)
    raise unsupported(f"storage SubtensorModule.{item}")


def _per_uid(conn: sqlite3.Connection, item: str, params: list) -> Any:
    """Items keyed by the mechanism storage index (`mechid * 4096 + netuid`), one entry per uid."""
    index = params[0]
    if index >= MECHANISM_STRIDE:
        return None  # only mechanism 0 exists
    if item == "Weights":
        rows = dict(store.weight_rows(conn, index))
        return [list(pair) for pair in rows.get(params[1], [])]
    if item == "Keys":
        neurons = store.neuron_rows(conn, index)
        uid = params[1]
        return neurons[uid].hotkey if 0 <= uid < len(neurons) else None
    neurons = store.neuron_rows(conn, index)
    if item == "LastUpdate":
        return [n.last_update for n in neurons]
    subnet = store.subnet_row(conn, index)
    return store.validator_permits(neurons, subnet.max_validators) if subnet else []


def storage_map(conn: sqlite3.Connection, module: str, item: str, params: list) -> list[tuple[Any, Any]]:
    """A whole storage map (or its prefix under `params`) as decoded `(key, value)` pairs."""
    key = (module, item)
    if key == ("Commitments", "CommitmentOf"):
        return store.commitment_records(conn, params[0])
    if key == ("Commitments", "RevealedCommitments"):
        return []
    if key == ("SubtensorModule", "Uids"):
        return [(n.hotkey, n.uid) for n in store.neuron_rows(conn, params[0])]
    if key == ("SubtensorModule", "Keys"):
        return [(n.uid, n.hotkey) for n in store.neuron_rows(conn, params[0])]
    if key == ("SubtensorModule", "Weights"):
        if params[0] >= MECHANISM_STRIDE:
            return []
        return [(uid, [list(p) for p in row]) for uid, row in store.weight_rows(conn, params[0])]
    if key == ("SubtensorModule", "TokenSymbol"):
        return [(s.netuid, list(s.symbol.encode())) for s in store.subnet_rows(conn)]
    if key == ("SubtensorModule", "NetworksAdded"):
        return [(s.netuid, True) for s in store.subnet_rows(conn)]
    raise unsupported(f"storage map {module}.{item}")


def metagraph(conn: sqlite3.Connection, netuid: int, block: int) -> dict | None:
    """`SubnetInfoRuntimeApi.get_metagraph` in the decoded shape `bittensor.metagraph` reads."""
    subnet = store.subnet_row(conn, netuid)
    if subnet is None:
        return None
    neurons = store.neuron_rows(conn, netuid)
    n = len(neurons)
    zeros = [0] * n
    stakes = [x.stake for x in neurons]
    last_epoch = epochs.last_epoch(conn, netuid, subnet.registered_at)
    since = max(0, block - last_epoch)
    return {
        "netuid": netuid,
        "name": list(subnet.name.encode()),
        "symbol": list(subnet.symbol.encode()),
        "identity": None,
        "network_registered_at": subnet.registered_at,
        "owner_hotkey": subnet.owner_hotkey,
        "owner_coldkey": subnet.owner_coldkey,
        "block": block,
        "tempo": subnet.tempo,
        "last_step": last_epoch,
        "blocks_since_last_step": since,
        "num_uids": n,
        "max_uids": subnet.max_uids,
        "tao_in": store.RAO_PER_TAO,
        "alpha_in": store.RAO_PER_TAO,
        "moving_price": {"bits": 2**32},
        "hotkeys": [x.hotkey for x in neurons],
        "coldkeys": [x.coldkey for x in neurons],
        "identities": [None] * n,
        "axons": [None] * n,
        "active": [True] * n,
        "validator_permit": store.validator_permits(neurons, subnet.max_validators),
        "last_update": [x.last_update for x in neurons],
        "block_at_registration": [x.registered_at for x in neurons],
        "rank": epoch_column(conn, netuid, "rank"),
        "trust": epoch_column(conn, netuid, "trust"),
        "consensus": epoch_column(conn, netuid, "consensus"),
        "incentives": epoch_column(conn, netuid, "incentive"),
        "dividends": epoch_column(conn, netuid, "dividends"),
        "pruning_score": zeros,
        "emission": epoch_column(conn, netuid, "emission"),
        # Not in finney's runtime record (operators read it from storage `ValidatorTrust`);
        # carried here too so `Metagraph.raw` shows it.
        "validator_trust": epoch_column(conn, netuid, "validator_trust"),
        "alpha_stake": stakes,
        "tao_stake": zeros,
        "total_stake": stakes,
    }


_SUBNET_ITEMS = {
    "Tempo": lambda s, c: s.tempo,
    "WeightsSetRateLimit": lambda s, c: s.weights_rate_limit,
    "MinAllowedWeights": lambda s, c: s.min_allowed_weights,
    "MaxWeightsLimit": lambda s, c: s.max_weights_limit,
    "MaxAllowedUids": lambda s, c: s.max_uids,
    "MaxAllowedValidators": lambda s, c: s.max_validators,
    "Burn": lambda s, c: s.burn,
    "CommitRevealWeightsEnabled": lambda s, c: s.commit_reveal,
    "SubnetOwner": lambda s, c: s.owner_coldkey,
    "SubnetOwnerHotkey": lambda s, c: s.owner_hotkey,
    "NetworkRegisteredAt": lambda s, c: s.registered_at,
    "SubnetLocked": lambda s, c: s.locked,
    "SubnetworkN": lambda s, c: len(store.neuron_rows(c, s.netuid)),
    "TokenSymbol": lambda s, c: list(s.symbol.encode()),
    "CollateralLockShare": lambda s, c: 0,
    "SubnetEpochConsensus": lambda s, c: "Yuma",
    "RevealPeriodEpochs": lambda s, c: 1,
}
"""Per-subnet SubtensorModule storage items keyed by `[netuid]`."""
