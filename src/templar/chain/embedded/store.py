"""The embedded chain's state: one SQLite file shared by every process on the machine.

Blocks are not produced by a daemon. The block number is a pure function of wall-clock time
and the genesis recorded in the file (`genesis_block + (now - genesis_ts) // block_time`), so
every process that opens the file agrees on it without talking to anyone. Writes are
serialised by SQLite itself: WAL mode, one `BEGIN IMMEDIATE` transaction per extrinsic, and a
busy timeout so concurrent writers queue instead of failing.

This module knows nothing about bittensor; `embedded.py` maps SDK calls onto it.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from templar.chain.types import ChainUnavailable

SCHEMA_VERSION = 1
RAO_PER_TAO = 10**9

Now = Callable[[], float]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS accounts (
    address TEXT PRIMARY KEY, free INTEGER NOT NULL DEFAULT 0, nonce INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS owners (hotkey TEXT PRIMARY KEY, coldkey TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS subnets (
    netuid INTEGER PRIMARY KEY, owner_coldkey TEXT NOT NULL, owner_hotkey TEXT NOT NULL,
    registered_at INTEGER NOT NULL, locked INTEGER NOT NULL, tempo INTEGER NOT NULL,
    weights_rate_limit INTEGER NOT NULL, min_allowed_weights INTEGER NOT NULL,
    max_weights_limit INTEGER NOT NULL, max_uids INTEGER NOT NULL, max_validators INTEGER NOT NULL,
    burn INTEGER NOT NULL, commit_reveal INTEGER NOT NULL, name TEXT NOT NULL, symbol TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS neurons (
    netuid INTEGER NOT NULL, uid INTEGER NOT NULL, hotkey TEXT NOT NULL, coldkey TEXT NOT NULL,
    registered_at INTEGER NOT NULL, last_update INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (netuid, uid), UNIQUE (netuid, hotkey));
CREATE TABLE IF NOT EXISTS stakes (
    netuid INTEGER NOT NULL, hotkey TEXT NOT NULL, coldkey TEXT NOT NULL, alpha INTEGER NOT NULL,
    PRIMARY KEY (netuid, hotkey, coldkey));
CREATE TABLE IF NOT EXISTS weights (
    netuid INTEGER NOT NULL, uid INTEGER NOT NULL, row TEXT NOT NULL, PRIMARY KEY (netuid, uid));
CREATE TABLE IF NOT EXISTS commitments (
    netuid INTEGER NOT NULL, hotkey TEXT NOT NULL, block INTEGER NOT NULL, deposit INTEGER NOT NULL,
    fields TEXT NOT NULL, PRIMARY KEY (netuid, hotkey));
CREATE TABLE IF NOT EXISTS extrinsics (
    hash TEXT PRIMARY KEY, block INTEGER NOT NULL, idx INTEGER NOT NULL, signer TEXT NOT NULL,
    module TEXT NOT NULL, function TEXT NOT NULL, success INTEGER NOT NULL,
    error_name TEXT, error_message TEXT, events TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS extrinsics_by_block ON extrinsics (block, idx);
"""

_EPOCH_SCHEMA = """
CREATE TABLE IF NOT EXISTS epochs (netuid INTEGER PRIMARY KEY, block INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS epoch_results (
    netuid INTEGER NOT NULL, uid INTEGER NOT NULL, hotkey TEXT NOT NULL, stake REAL NOT NULL,
    consensus REAL NOT NULL, incentive REAL NOT NULL, dividends REAL NOT NULL, trust REAL NOT NULL,
    validator_trust REAL NOT NULL, rank REAL NOT NULL, emission INTEGER NOT NULL,
    PRIMARY KEY (netuid, uid));
CREATE TABLE IF NOT EXISTS bonds (netuid INTEGER PRIMARY KEY, entries TEXT NOT NULL);
"""
"""The subnet epoch's state (`templar.chain.embedded.epochs`): last epoch block, results per uid, bonds."""


_FAULT_SCHEMA = """
CREATE TABLE IF NOT EXISTS faults (
    id INTEGER PRIMARY KEY, module TEXT NOT NULL, function TEXT NOT NULL, signer TEXT,
    error_name TEXT NOT NULL, message TEXT NOT NULL, stage TEXT NOT NULL, remaining INTEGER NOT NULL);
"""
"""Refusals injected by tests and rehearsals (`ChainStore.inject_fault`); empty on a normal chain."""

FAULT_STAGES = ("pool", "dispatch")


@dataclass(frozen=True)
class Fault:
    """One injected refusal: `stage` "pool" is the node's transaction pool turning the extrinsic
    away (nothing lands, no nonce is used), "dispatch" a call that lands and fails with `error_name`."""

    error_name: str
    message: str
    stage: str


def ensure_epoch_schema(conn: sqlite3.Connection) -> None:
    """Create the epoch tables (idempotent), also in chain files made before they existed."""
    for statement in filter(str.strip, (_EPOCH_SCHEMA + _FAULT_SCHEMA).split(";")):
        conn.execute(statement)


@dataclass(frozen=True)
class ChainSpec:
    """Genesis settings of an embedded chain; new subnets copy the subnet defaults.

    Block time is the one knob that matters for speed: the tiny preset uses 1 s, tests use
    0.05-0.2 s. `first_netuid` is the netuid the first `register_network` receives, so a
    dev chain can host the subnet under the same netuid the flags name.
    """

    block_time: float = 1.0
    genesis_block: int = 1
    first_netuid: int = 1
    weights_rate_limit: int = 10
    min_allowed_weights: int = 1
    max_weights_limit: int = 65535
    tempo: int = 360
    max_uids: int = 256
    max_validators: int = 64
    burn_rao: int = 0
    subnet_lock_rao: int = 0

    def __post_init__(self) -> None:
        if not self.block_time > 0:
            raise ValueError(f"block_time must be positive, got {self.block_time}")
        if self.first_netuid < 1:
            raise ValueError("first_netuid must be >= 1 (netuid 0 is the root network)")
        for name in (
            "weights_rate_limit",
            "min_allowed_weights",
            "burn_rao",
            "subnet_lock_rao",
            "genesis_block",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.tempo < 1:
            raise ValueError(f"tempo must be at least 1 block, got {self.tempo}")
        if not 0 < self.max_weights_limit <= 65535 or self.max_uids < 1 or self.max_validators < 1:
            raise ValueError("max_weights_limit, max_uids and max_validators must be positive")


class BlockClock:
    """Block number <-> unix time for a chain whose blocks follow the wall clock exactly."""

    def __init__(self, genesis_ts: float, genesis_block: int, block_time: float, now: Now = time.time):
        self.genesis_ts = genesis_ts
        self.genesis_block = genesis_block
        self.block_time = block_time
        self._now = now

    def now(self) -> float:
        """Unix seconds by this chain's time source."""
        return self._now()

    def block(self) -> int:
        """The current block: how many whole block times have passed since genesis."""
        elapsed = max(0.0, self._now() - self.genesis_ts)
        return self.genesis_block + int(elapsed // self.block_time)

    def timestamp(self, block: int) -> float:
        """Unix time at which `block` starts; exact for past and future blocks alike."""
        return self.genesis_ts + (block - self.genesis_block) * self.block_time


class ManualTime:
    """A settable time source for tests: `advance(seconds)` moves every clock built on it."""

    def __init__(self, start: float | None = None) -> None:
        self.value = time.time() if start is None else start

    def __call__(self) -> float:
        return self.value

    def advance(self, seconds: float) -> None:
        self.value += seconds


@dataclass(frozen=True)
class SubnetRow:
    netuid: int
    owner_coldkey: str
    owner_hotkey: str
    registered_at: int
    locked: int
    tempo: int
    weights_rate_limit: int
    min_allowed_weights: int
    max_weights_limit: int
    max_uids: int
    max_validators: int
    burn: int
    commit_reveal: bool
    name: str
    symbol: str


@dataclass(frozen=True)
class NeuronRow:
    uid: int
    hotkey: str
    coldkey: str
    registered_at: int
    last_update: int
    stake: int  # alpha rao summed over every coldkey staking to the hotkey


SUBNET_PARAMS = (
    "tempo",
    "weights_rate_limit",
    "min_allowed_weights",
    "max_weights_limit",
    "max_uids",
    "max_validators",
    "burn",
    "commit_reveal",
)
"""Subnet hyperparameters the dev-chain operator may change after creation."""


def _connect(path: Path, busy_timeout_s: float) -> sqlite3.Connection:
    """An autocommit connection (we issue BEGIN ourselves) in WAL mode with a busy timeout."""
    try:
        conn = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise ChainUnavailable(f"cannot open embedded chain {path}: {exc}") from exc
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
    except sqlite3.Error as exc:
        conn.close()
        raise ChainUnavailable(f"{path} is not a usable embedded chain file: {exc}") from exc
    return conn


class ChainStore:
    """An open embedded chain. Thread-safe; one instance per process is enough."""

    def __init__(self, path: str | Path, *, now: Now = time.time, busy_timeout_s: float = 10.0):
        self.path = Path(path).expanduser()
        if not self.path.is_file():
            raise ChainUnavailable(
                f"no embedded chain at {self.path}; create it with `templar chain init "
                f"--subtensor.chain_endpoint {self.path}`"
            )
        self._lock = threading.RLock()
        self._conn = _connect(self.path, busy_timeout_s)
        try:
            meta = dict(self._conn.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.Error as exc:
            self._conn.close()
            raise ChainUnavailable(f"{self.path} is not a readable embedded chain: {exc}") from exc
        if meta.get("schema") != str(SCHEMA_VERSION) or "spec" not in meta:
            self._conn.close()
            raise ChainUnavailable(
                f"{self.path} is not an embedded chain of schema {SCHEMA_VERSION} "
                f"(found {meta.get('schema')!r}); delete it and run `templar chain init` again"
            )
        try:
            if not self._conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'faults'").fetchone():
                with self.write() as conn:
                    ensure_epoch_schema(conn)  # a file made before the epoch (or fault) tables existed
        except (ChainUnavailable, sqlite3.Error) as exc:
            self._conn.close()
            raise ChainUnavailable(f"{self.path}: cannot add the epoch tables: {exc}") from exc
        known = {f.name for f in fields(ChainSpec)}
        self.spec = ChainSpec(**{k: v for k, v in json.loads(meta["spec"]).items() if k in known})
        self.clock = BlockClock(float(meta["genesis_ts"]), self.spec.genesis_block, self.spec.block_time, now)
        self.genesis_hash = "0x" + meta["genesis_hash"]

    @classmethod
    def create(cls, path: str | Path, spec: ChainSpec, *, now: Now = time.time) -> ChainStore:
        """Create the chain file with genesis `spec`, or open it unchanged if it exists."""
        path = Path(path).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = _connect(path, 10.0)
        try:
            conn.execute("BEGIN IMMEDIATE")
            # executescript() would COMMIT on its own; run the statements inside our transaction.
            for statement in filter(str.strip, _SCHEMA.split(";")):
                conn.execute(statement)
            ensure_epoch_schema(conn)
            genesis_ts = now()
            rows = {
                "schema": str(SCHEMA_VERSION),
                "genesis_ts": repr(genesis_ts),
                "genesis_hash": os.urandom(32).hex(),
                "spec": json.dumps(asdict(spec)),
            }
            conn.executemany("INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)", rows.items())
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise ChainUnavailable(f"cannot create an embedded chain at {path}: {exc}") from exc
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            conn.close()
        return cls(path, now=now)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> ChainStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A consistent snapshot for several SELECTs (a deferred read transaction)."""
        with self._lock, self._unavailable_on_sqlite_error():
            self._conn.execute("BEGIN")
            try:
                yield self._conn
            finally:
                self._conn.execute("COMMIT")

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One atomic write: `BEGIN IMMEDIATE` takes the file's write lock up front."""
        with self._lock, self._unavailable_on_sqlite_error():
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    @contextmanager
    def _unavailable_on_sqlite_error(self) -> Iterator[None]:
        """A locked-out (busy past the timeout), vanished or corrupt file is an unavailable chain."""
        try:
            yield
        except sqlite3.Error as exc:
            raise ChainUnavailable(f"embedded chain {self.path}: {exc}") from exc

    # -- operator actions (genesis-style writes; no extrinsic, no SDK) ---------------------

    def fund(self, address: str, rao: int) -> None:
        """Dev faucet: credit free balance, as `//Alice` transfers would on a local node."""
        if rao < 0:
            raise ValueError("cannot fund a negative amount")
        with self.write() as conn:
            conn.execute(
                "INSERT INTO accounts (address, free) VALUES (?, ?) "
                "ON CONFLICT (address) DO UPDATE SET free = free + excluded.free",
                (address, rao),
            )

    def inject_fault(self, function: str, error_name: str, *, times: int = 1, stage: str = "dispatch",
                     message: str | None = None, module: str = "SubtensorModule", signer: str | None = None) -> None:
        """Make the next `times` extrinsics calling `module.function` (signed by `signer`, or anyone)
        fail with the chain error `error_name`, as a real node would refuse them (see `Fault`).

        The seam through which tests and rehearsals produce refusals the embedded chain never
        reaches on its own ("Priority is too low", a stake floor, a pending commit); the SDK and our
        adapter see exactly what a node would send. Kept in the chain file, so it reaches every
        process using the chain."""
        if stage not in FAULT_STAGES:
            raise ValueError(f"stage must be one of {FAULT_STAGES}, got {stage!r}")
        if times < 1 or not error_name:
            raise ValueError("a fault needs an error name and times >= 1")
        with self.write() as conn:
            conn.execute(
                "INSERT INTO faults (module, function, signer, error_name, message, stage, remaining) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (module, function, signer, error_name, message or "", stage, times),
            )

    def set_subnet_params(self, netuid: int, **params: int) -> None:
        """Root-style override of subnet hyperparameters (see `SUBNET_PARAMS`)."""
        unknown = set(params) - set(SUBNET_PARAMS)
        if unknown:
            raise ValueError(f"unknown subnet parameters {sorted(unknown)}; known: {SUBNET_PARAMS}")
        if not params:
            return
        with self.write() as conn:
            if subnet_row(conn, netuid) is None:
                raise ValueError(f"subnet {netuid} does not exist on the embedded chain {self.path}")
            assignments = ", ".join(f"{name} = ?" for name in params)
            conn.execute(f"UPDATE subnets SET {assignments} WHERE netuid = ?", (*params.values(), netuid))


# -- read helpers (take any connection, so runtime handlers reuse them inside a write) ------


def subnet_row(conn: sqlite3.Connection, netuid: int) -> SubnetRow | None:
    row = conn.execute(
        f"SELECT {', '.join(f.name for f in fields(SubnetRow))} FROM subnets WHERE netuid = ?", (netuid,)
    ).fetchone()
    return SubnetRow(*row[:12], bool(row[12]), *row[13:]) if row else None


def subnet_rows(conn: sqlite3.Connection) -> list[SubnetRow]:
    netuids = [n for (n,) in conn.execute("SELECT netuid FROM subnets ORDER BY netuid")]
    return [row for n in netuids if (row := subnet_row(conn, n)) is not None]


def neuron_rows(conn: sqlite3.Connection, netuid: int) -> list[NeuronRow]:
    rows = conn.execute(
        "SELECT n.uid, n.hotkey, n.coldkey, n.registered_at, n.last_update, "
        "COALESCE((SELECT SUM(alpha) FROM stakes s WHERE s.netuid = n.netuid AND s.hotkey = n.hotkey), 0) "
        "FROM neurons n WHERE n.netuid = ? ORDER BY n.uid",
        (netuid,),
    ).fetchall()
    return [NeuronRow(*row) for row in rows]


def uid_of(conn: sqlite3.Connection, netuid: int, hotkey: str) -> int | None:
    row = conn.execute("SELECT uid FROM neurons WHERE netuid = ? AND hotkey = ?", (netuid, hotkey)).fetchone()
    return int(row[0]) if row else None


def validator_permits(neurons: list[NeuronRow], max_validators: int) -> list[bool]:
    """Top-`max_validators` staked neurons hold a permit (stake > 0; ties go to the lower uid).

    The real chain recomputes permits at each epoch; the embedded chain has no epochs, so the
    permit follows stake immediately.
    """
    ranked = sorted((n for n in neurons if n.stake > 0), key=lambda n: (-n.stake, n.uid))
    holders = {n.uid for n in ranked[:max_validators]}
    return [n.uid in holders for n in neurons]


def weight_rows(conn: sqlite3.Connection, netuid: int) -> list[tuple[int, list[tuple[int, int]]]]:
    rows = conn.execute("SELECT uid, row FROM weights WHERE netuid = ? ORDER BY uid", (netuid,))
    return [(int(uid), [(int(d), int(v)) for d, v in json.loads(row)]) for uid, row in rows]


def commitment_record(conn: sqlite3.Connection, netuid: int, hotkey: str) -> dict | None:
    row = conn.execute(
        "SELECT block, deposit, fields FROM commitments WHERE netuid = ? AND hotkey = ?", (netuid, hotkey)
    ).fetchone()
    return _record(*row) if row else None


def commitment_records(conn: sqlite3.Connection, netuid: int) -> list[tuple[str, dict]]:
    rows = conn.execute(
        "SELECT hotkey, block, deposit, fields FROM commitments WHERE netuid = ? ORDER BY hotkey", (netuid,)
    )
    return [(hotkey, _record(block, deposit, fields_json)) for hotkey, block, deposit, fields_json in rows]


def _record(block: int, deposit: int, fields_json: str) -> dict:
    """The decoded `CommitmentOf` shape the RPC backend hands to the SDK."""
    return {"block": int(block), "deposit": int(deposit), "info": {"fields": json.loads(fields_json)}}


def account(conn: sqlite3.Connection, address: str) -> tuple[int, int]:
    """(free balance in rao, next nonce) of an account; zeros when it never existed."""
    row = conn.execute("SELECT free, nonce FROM accounts WHERE address = ?", (address,)).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def owner_of(conn: sqlite3.Connection, hotkey: str) -> str | None:
    row = conn.execute("SELECT coldkey FROM owners WHERE hotkey = ?", (hotkey,)).fetchone()
    return str(row[0]) if row else None


def take_fault(conn: sqlite3.Connection, module: str, function: str, signer: str) -> Fault | None:
    """The oldest injected fault matching this call, used up by one (call inside a write)."""
    row = conn.execute(
        "SELECT id, error_name, message, stage FROM faults WHERE module = ? AND function = ? "
        "AND (signer IS NULL OR signer = ?) AND remaining > 0 ORDER BY id LIMIT 1",
        (module, function, signer),
    ).fetchone()
    if row is None:
        return None
    conn.execute("UPDATE faults SET remaining = remaining - 1 WHERE id = ?", (row[0],))
    return Fault(error_name=row[1], message=row[2], stage=row[3])


def extrinsic_row(conn: sqlite3.Connection, extrinsic_hash: str) -> tuple | None:
    return conn.execute(
        "SELECT block, idx, success, error_name, error_message, events FROM extrinsics WHERE hash = ?",
        (extrinsic_hash,),
    ).fetchone()


def block_events(conn: sqlite3.Connection, block: int) -> list[dict]:
    rows = conn.execute("SELECT events FROM extrinsics WHERE block = ? ORDER BY idx", (block,))
    return [event for (events,) in rows for event in json.loads(events)]
