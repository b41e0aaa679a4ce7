"""A small localnet run directory built from real parts, in about a second.

A real embedded chain (`create_dev_chain`) with two validators and seven miners, weights set
and buckets committed through the real `Chain`; a real `ScoreBook` driven window by window
through its scoring methods, with the records the validator loop writes (`PeerScoreRecord`,
`ValidatorWindowRecord`, `scorebook.json`) and miners' `MinerWindowRecord`s, all written with
`templar.runtime.records.append_record`; `nodes.json` as `templar localnet` writes it. Only the
training itself is replaced by chosen numbers, so every page has something true to show.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

from templar.chain import DevChain, create_dev_chain
from templar.core.config import load_hparams
from templar.gauntlet import PrimaryResult, ScoreBook
from templar.runtime.records import (
    MINER_WINDOWS_FILE,
    SCORES_FILE,
    VALIDATOR_WINDOWS_FILE,
    WEIGHTS_FILE,
    MinerWindowRecord,
    PeerScoreRecord,
    ValidatorWindowRecord,
    WeightsRecord,
    append_record,
)
from templar.runtime.roster import NodeInfo, write_nodes

NETUID = 1  # the localnet's
WINDOWS = 14
MINERS = {"miner0": "honest", "miner1": "honest", "miner2": "honest", "miner3": "honest",
          "copycat0": "copycat", "lazy0": "lazy", "late0": "late"}
VALIDATORS = {"validator0": 10_000.0, "validator1": 500.0}
S3_SECRET = "S3READSECRETdoNotShow0123456789"


@dataclass
class Run:
    out: Path
    dev: DevChain
    nodes: list[NodeInfo]
    books: dict[str, ScoreBook]
    last_window: int
    secret: bytes

    def node(self, name: str) -> NodeInfo:
        return next(n for n in self.nodes if n.name == name)

    def state_dir(self, name: str) -> Path:
        return self.out / "nodes" / name


def _verdict(strategy: str, idx: int, rng: random.Random) -> tuple[str, float | None]:
    if strategy == "late":
        return "late", None
    if strategy == "copycat" and idx >= 1:
        return "copy", 0.2
    if idx == 0:
        return "warmup", 0.0
    return "ok", round(rng.uniform(0.05, 0.6), 3)


def _deltas(strategy: str, rng: random.Random) -> PrimaryResult:
    if strategy == "lazy":  # trains on the wrong pages: no gain on its assigned data beyond random data
        return PrimaryResult(rng.uniform(0.004, 0.008), rng.uniform(0.010, 0.014))
    return PrimaryResult(rng.uniform(0.025, 0.045), rng.uniform(0.008, 0.014))


def score_window(book: ScoreBook, window: int, idx: int, nodes: list[NodeInfo], state_dir: Path,
                 rng: random.Random, loss: float, absent: dict[str, int] | None = None) -> dict[str, float]:
    """One validator window, as `Validator.run_window` records it; returns the weights. `absent`:
    registered hotkeys (hotkey -> uid) that never committed a bucket, drawn for fast evaluation
    every other window and found `missing` (the subnet owner's uid 0 is one)."""
    hp = load_hparams("tiny")
    # tiny's rules with the paper's sign proof and OpenSkill rating, as this fixture's runs were scored
    g = hp.gauntlet.model_copy(update={"proof_credit": "sign", "proof_full_gap": 1.0, "loss_rating": "openskill",
                                       "mu_prior_evals": None})
    miners = {n.hotkey: n.uid for n in nodes if n.role == "miner"}
    book.sync_registry(miners | (absent or {}))  # the validator's registry: every hotkey without a permit
    verdicts = {}
    for n in nodes:
        if n.role != "miner":
            continue
        status, sync = _verdict(n.strategy, idx, rng)
        verdicts[n.hotkey] = (status, sync)
        book.get_or_create(n.hotkey, n.uid, window)
        book.record_fast_eval(g, n.hotkey, status in {"ok", "warmup"}, status, sync_steps=sync)
    for hotkey, uid in (absent or {}).items():
        if idx % 2 == 0:
            verdicts[hotkey] = ("missing", None)
            book.get_or_create(hotkey, uid, window)
            book.record_fast_eval(g, hotkey, False, "missing")
    strategy = {n.hotkey: n.strategy for n in nodes}
    results = {hk: _deltas(strategy[hk], rng) for hk, (status, _) in verdicts.items() if status == "ok"}
    if results:
        book.record_primary(g, results)
    weights = book.weights(g)
    top = book.top_g(g)
    paid = book.paid_mus(g)
    for hotkey in sorted(book):
        rec = book.peers[hotkey]
        status, sync = verdicts.get(hotkey, ("not-sampled", None))
        res = results.get(hotkey)
        append_record(state_dir / SCORES_FILE, PeerScoreRecord(
            window=window, hotkey=hotkey, uid=rec.uid, status=status, evaluated=res is not None,
            sync_steps=sync, delta_assigned=res.delta_assigned if res else None,
            delta_rand=res.delta_rand if res else None, mu=rec.mu, rating=rec.loss_rating, score=rec.score,
            weight=weights.get(hotkey, 0.0), in_top_g=hotkey in top, paid_mu=paid[hotkey]))
    append_record(state_dir / VALIDATOR_WINDOWS_FILE, ValidatorWindowRecord(
        window=window, global_step=idx, learning_rate=hp.optimizer.learning_rate * min(1.0, (idx + 1) / 2),
        holdout_loss=loss, peers_aggregated=min(len(top), 4), gathered=len(verdicts), evaluated=len(results),
        wall_seconds=round(rng.uniform(5.5, 9.0), 2), weights_set=idx % 2 == 0,
        gather_seconds=round(rng.uniform(1.0, 3.0), 2)))
    book.save(state_dir / "scorebook.json")
    return weights


def miner_window(state_dir: Path, window: int, idx: int, strategy: str, rng: random.Random) -> None:
    append_record(state_dir / MINER_WINDOWS_FILE, MinerWindowRecord(
        window=window, phase="warmup" if idx == 0 else "active", strategy=strategy, global_step=idx,
        loss=round(9.0 - 0.22 * idx + rng.uniform(-0.05, 0.05), 4),
        tokens_per_second=round(rng.uniform(2400, 3100), 1), pages=2, uploaded=strategy != "late" or idx % 2 == 0,
        upload_bytes=rng.randint(150_000, 170_000), upload_seconds=round(rng.uniform(0.05, 0.4), 3),
        peers_aggregated=0 if idx == 0 else 4, overhead_share=round(rng.uniform(0.12, 0.3), 3),
        train_seconds=(seconds := round(rng.uniform(17.0, 19.0), 2)), utilisation=seconds / 20.0))


def build_run(out: Path, *, windows: int = WINDOWS) -> Run:
    out.mkdir(parents=True, exist_ok=True)
    hp = load_hparams("tiny")
    planned = {**VALIDATORS, **dict.fromkeys(MINERS, 0.0)}
    # genesis in the past, so the chain's current window follows the windows recorded below
    started = time.time() - (windows + 1.5) * hp.windows.blocks_per_window * hp.windows.block_time
    dev = create_dev_chain(out / "chain.sqlite", netuid=NETUID, hotkeys=planned, wallet_path=out / "wallets",
                           wallet_name="localnet", block_time=hp.windows.block_time, weights_rate_limit=1,
                           now=lambda: started)
    nodes = [NodeInfo(name=name, hotkey=dev.wallets[name].hotkey, uid=dev.wallets[name].uid,
                      role="validator" if name in VALIDATORS else "miner",
                      strategy=("lead" if name == "validator0" else "validator") if name in VALIDATORS
                      else MINERS[name], stake=planned[name]) for name in planned]
    write_nodes(out, nodes)
    block = dev.connect("validator0").block()
    first = max(0, block // hp.windows.blocks_per_window - windows)
    rng = random.Random(7)
    books = {name: ScoreBook() for name in VALIDATORS}
    secret = os.urandom(32)
    weights: dict[str, dict[str, float]] = {}
    for name in VALIDATORS:
        d = out / "nodes" / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "eval_secret").write_bytes(secret)
        (d / "node.log").write_text("2026-01-01 00:00:00.000 INFO    w=- active    x [SYNC] Active as validator\n")
    for name in MINERS:
        d = out / "nodes" / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "node.log").write_text(
            "2026-01-01 00:00:00.000 INFO    w=- catchup   x [SYNC] Checking registration of miner\n"
            "2026-01-01 00:00:05.000 INFO    w=- active    x [SYNC] Active: full participation\n")
    for idx in range(windows):
        window = first + idx
        loss = 9.05 - 2.6 * (1 - 0.83 ** idx) + rng.uniform(-0.02, 0.02)
        for name in VALIDATORS:
            weights[name] = score_window(books[name], window, idx, nodes, out / "nodes" / name, rng, loss,
                                         absent={dev.owner.hotkey: dev.owner.uid})
        for name, strategy in MINERS.items():
            miner_window(out / "nodes" / name, window, idx, strategy, rng)
    by_name = {n.hotkey: n for n in nodes}
    for name in VALIDATORS:
        chain = dev.connect(name)
        try:
            chain.set_weights({by_name[hk].uid: w for hk, w in weights[name].items() if w > 0})
        finally:
            chain.close()
    # what `templar.validator.weights` records: one refusal told, then the retry that landed
    last_weights = first + windows - 1 - (first + windows - 1) % hp.windows.windows_per_weights
    for attempt, outcome, reason in ((1, "refused", "priority_too_low"), (2, "set", "")):
        append_record(out / "nodes" / "validator0" / WEIGHTS_FILE, WeightsRecord(
            window=last_weights, attempt=attempt, outcome=outcome, reason=reason, uids=len(MINERS), block=block,
            detail="The extrinsic's priority is too low [PriorityTooLow]" if reason else "",
            next="backing off; retrying in 1s (attempt 2)" if reason else ""))
    for n in nodes:
        chain = dev.connect(n.name)
        try:
            locator = (f"s3:http://127.0.0.1:9|tpl-{n.name}|READKEYID|{S3_SECRET}" if n.name == "miner1"
                       else f"local:{out / 'buckets' / n.name}")
            chain.commit_bucket(locator, validator=n.role == "validator")
        finally:
            chain.close()
    return Run(out=out, dev=dev, nodes=nodes, books=books, last_window=first + windows - 1, secret=secret)
