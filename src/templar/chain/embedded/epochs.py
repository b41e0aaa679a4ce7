"""The embedded chain's subnet epoch: Yuma consensus every tempo, stored where the metagraph reads it.

The embedded chain has no block author, so nothing runs "at" a block. Instead every write
(`EmbeddedSubstrate.submit`) and every metagraph read first runs the epochs that fell due since
the last one, inside one write transaction. Weights only change through writes, so an epoch run
late still sees exactly the weights that were on chain at its block.

Schedule as on subtensor: subnet `netuid` runs its epoch at every block b with
(b + netuid + 1) % (tempo + 1) == 0. Each epoch emits `EMISSION_PER_BLOCK` × (tempo + 1) rao of
alpha, split by `yuma.epoch` (owner 18 %, miners 41 %, validators 41 %). Emission is recorded
per uid (the metagraph's `emission` column) but not credited to stake, so validator permits
and the localnet's lead stay where the operator put them.

If many epochs were missed (nobody touched the chain for a long time), only the last
`MAX_CATCH_UP` run: the weights were the same for all of them, and bonds converge
geometrically (0.9^16 ≈ 0.19 of the old bonds remain).
"""

from __future__ import annotations

import json
import sqlite3

import numpy as np

from templar.chain.embedded import store, yuma
from templar.chain.types import next_epoch_block

EMISSION_PER_BLOCK = store.RAO_PER_TAO
"""Alpha emitted into the subnet per block on the embedded chain (1 alpha; finney varies)."""

MAX_CATCH_UP = 16

COLUMNS = ("stake", "consensus", "incentive", "dividends", "trust", "validator_trust", "rank", "emission")


def is_epoch_block(block: int, netuid: int, tempo: int) -> bool:
    return next_epoch_block(block, netuid, tempo) == block


def due_epochs(last: int, block: int, netuid: int, tempo: int) -> list[int]:
    """Epoch blocks in (last, block], the newest `MAX_CATCH_UP` of them, oldest first."""
    if tempo <= 0 or block <= last:
        return []
    period = tempo + 1
    newest = next_epoch_block(block - tempo, netuid, tempo)  # the last epoch block at or before `block`
    assert newest is not None
    out = []
    b = newest
    while b > last and len(out) < MAX_CATCH_UP:
        out.append(b)
        b -= period
    return out[::-1]


def last_epoch(conn: sqlite3.Connection, netuid: int, registered_at: int) -> int:
    row = conn.execute("SELECT block FROM epochs WHERE netuid = ?", (netuid,)).fetchone()
    return int(row[0]) if row else registered_at


def pending(conn: sqlite3.Connection, block: int) -> bool:
    """Whether any subnet has an epoch due at or before `block` (a cheap read)."""
    for subnet in store.subnet_rows(conn):
        if due_epochs(last_epoch(conn, subnet.netuid, subnet.registered_at), block, subnet.netuid, subnet.tempo):
            return True
    return False


def _load_bonds(conn: sqlite3.Connection, netuid: int, n: int) -> np.ndarray:
    row = conn.execute("SELECT entries FROM bonds WHERE netuid = ?", (netuid,)).fetchone()
    bonds = np.zeros((n, n))
    for i, j, value in json.loads(row[0]) if row else []:
        if i < n and j < n:
            bonds[i, j] = value
    return bonds


def run_epoch(conn: sqlite3.Connection, subnet: store.SubnetRow, block: int) -> yuma.EpochResult:
    """Run one epoch of `subnet` at `block` on the current chain state and store its results."""
    neurons = store.neuron_rows(conn, subnet.netuid)
    n = len(neurons)
    weights = np.zeros((n, n))
    for uid, row in store.weight_rows(conn, subnet.netuid):
        for dest, value in row:
            if uid < n and dest < n:
                weights[uid, dest] = value
    result = yuma.epoch(
        yuma.EpochInputs(
            weights=weights,
            stake=np.array([x.stake for x in neurons], dtype=float),
            permit=np.array(store.validator_permits(neurons, subnet.max_validators), dtype=bool),
            last_update=np.array([x.last_update for x in neurons], dtype=np.int64),
            registered_at=np.array([x.registered_at for x in neurons], dtype=np.int64),
            block=block,
            bonds=_load_bonds(conn, subnet.netuid, n),
            emission=float(EMISSION_PER_BLOCK * (subnet.tempo + 1)),
        )
    )
    conn.execute("DELETE FROM epoch_results WHERE netuid = ?", (subnet.netuid,))
    conn.executemany(
        "INSERT INTO epoch_results (netuid, uid, hotkey, stake, consensus, incentive, dividends, trust, "
        "validator_trust, rank, emission) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (subnet.netuid, x.uid, x.hotkey, *(r[c] for c in COLUMNS[:-1]), round(r["emission"]))
            for x, r in zip(neurons, result.as_rows(), strict=True)
        ],
    )
    entries = [[int(i), int(j), float(result.bonds[i, j])] for i, j in zip(*np.nonzero(result.bonds), strict=True)]
    conn.execute(
        "INSERT INTO bonds (netuid, entries) VALUES (?, ?) "
        "ON CONFLICT (netuid) DO UPDATE SET entries = excluded.entries",
        (subnet.netuid, json.dumps(entries)),
    )
    conn.execute(
        "INSERT INTO epochs (netuid, block) VALUES (?, ?) ON CONFLICT (netuid) DO UPDATE SET block = excluded.block",
        (subnet.netuid, block),
    )
    return result


def advance(conn: sqlite3.Connection, block: int) -> int:
    """Run every epoch due at or before `block`, in the caller's write transaction; return how many."""
    count = 0
    for subnet in store.subnet_rows(conn):
        for epoch_block in due_epochs(last_epoch(conn, subnet.netuid, subnet.registered_at), block,
                                      subnet.netuid, subnet.tempo):
            run_epoch(conn, subnet, epoch_block)
            count += 1
    return count


def results(conn: sqlite3.Connection, netuid: int) -> dict[int, dict[str, float]]:
    """The last epoch's results by uid, only for uids still held by the hotkey they were computed for."""
    current = {x.uid: x.hotkey for x in store.neuron_rows(conn, netuid)}
    rows = conn.execute(
        f"SELECT uid, hotkey, {', '.join(COLUMNS)} FROM epoch_results WHERE netuid = ?", (netuid,)
    ).fetchall()
    return {
        int(uid): dict(zip(COLUMNS, map(float, values), strict=True))
        for uid, hotkey, *values in rows
        if current.get(int(uid)) == hotkey
    }
