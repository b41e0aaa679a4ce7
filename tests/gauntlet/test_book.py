"""ScoreBook: registry handling, score updates, exact persistence, crash safety."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from tests.rules import gauntlet_rules

from templar.core.config import GauntletConfig
from templar.core.strict import HISTORY_LIMIT
from templar.gauntlet import DEFAULT_RATING, PrimaryResult, ScoreBook, ScoreBookError
from templar.gauntlet.book import window_loss_scale

RULES = gauntlet_rules(mu_gamma=0.9, openskill_beta=25 / 6, openskill_tau=25 / 300, fast_eval_penalty=0.75,
                       power=2.0)
"""The rules these books are scored by (the paper's scoring; μ's γ 0.9, OpenSkill's default β and τ)."""


def _populated_book() -> ScoreBook:
    """A book whose floats exercise repr round-trips: 0.1+0.2, denormals, ±inf, long mantissas."""
    book = ScoreBook()
    for uid, hotkey in enumerate(("5Alice", "5Bob", "5Carol", "5Dave")):
        book.get_or_create(hotkey, uid, window=10 + uid)
    book.record_primary(RULES, {
        "5Alice": PrimaryResult(0.1 + 0.2, 1e-300),
        "5Bob": PrimaryResult(-math.inf, 0.012345678901234567),
        "5Carol": PrimaryResult(0.5, 0.25),
    })
    book.record_fast_eval(RULES, "5Alice", True, "ok", sync_steps=1.0 / 3.0)
    book.record_fast_eval(RULES, "5Bob", False, "desync", sync_steps=math.inf)
    book.record_fast_eval(RULES, "5Dave", False, "missing")
    book.weights(RULES)
    return book


# ---- registry -----------------------------------------------------------------------------------


def test_get_or_create_makes_fresh_records_and_tracks_windows() -> None:
    book = ScoreBook()
    record = book.get_or_create("5Alice", 3, window=100)
    assert (record.uid, record.mu, record.rating, record.score) == (3, 0.0, DEFAULT_RATING, 0.0)
    assert (record.first_seen_window, record.last_seen_window, record.last_status) == (100, 100, "new")
    assert book.get_or_create("5Alice", 3, window=105) is record
    assert (record.first_seen_window, record.last_seen_window) == (100, 105)
    book.get_or_create("5Alice", 3, window=101)  # an older window never moves last_seen back
    assert record.last_seen_window == 105


def test_recycled_uid_starts_fresh_via_sync_registry() -> None:
    book = ScoreBook()
    old = book.get_or_create("5Old", 7, window=1)
    old.mu, old.rating = 0.9, (40.0, 2.0)
    assert book.scores(RULES)["5Old"] > 0
    dropped = book.sync_registry({"5New": 7, "5Other": 8})
    assert dropped == ["5Old"]
    assert "5Old" not in book
    new = book.get_or_create("5New", 7, window=50)
    assert (new.mu, new.rating, new.score, new.first_seen_window) == (0.0, DEFAULT_RATING, 0.0, 50)


def test_recycled_uid_starts_fresh_via_get_or_create() -> None:
    book = ScoreBook()
    book.get_or_create("5Old", 7, window=1).mu = 0.9
    fresh = book.get_or_create("5New", 7, window=2)
    assert "5Old" not in book and fresh.mu == 0.0


def test_hotkey_on_a_new_uid_reregistered_and_starts_fresh() -> None:
    book = ScoreBook()
    book.get_or_create("5Alice", 1, window=1).mu = 0.8
    assert book.sync_registry({"5Alice": 2}) == ["5Alice"]
    book.get_or_create("5Bob", 3, window=1).mu = 0.8
    assert book.get_or_create("5Bob", 4, window=9).mu == 0.0


def test_sync_registry_keeps_registered_and_rejects_inconsistent_maps() -> None:
    book = ScoreBook()
    book.get_or_create("5Alice", 1, window=1).mu = 0.5
    assert book.sync_registry({"5Alice": 1, "5Unseen": 2}) == []
    assert book.peers["5Alice"].mu == 0.5 and "5Unseen" not in book
    with pytest.raises(ValueError, match="uid 1"):
        book.sync_registry({"5Alice": 1, "5Mallory": 1})
    book.forget("5Alice")
    book.forget("5Alice")  # idempotent
    assert len(book) == 0


# ---- scoring ------------------------------------------------------------------------------------


def test_fast_eval_penalty_sequence(gauntlet_cfg: GauntletConfig) -> None:
    book = ScoreBook()
    record = book.get_or_create("5Alice", 0, window=0)
    record.mu = 1.0
    assert gauntlet_cfg.fast_eval_penalty == 0.75
    seen = []
    for passed, status in ((False, "late"), (False, "missing"), (True, "ok")):
        seen.append(book.record_fast_eval(gauntlet_cfg, "5Alice", passed, status, sync_steps=0.5).mu)
    assert seen == [0.75, 0.5625, 0.5625]  # 1 → 0.75 → 0.5625, a pass changes nothing
    assert (record.fast_eval_fails, record.fast_eval_passes, record.last_status) == (2, 1, "ok")
    assert record.last_sync_steps == 0.5
    with pytest.raises(KeyError, match="get_or_create"):
        book.record_fast_eval(gauntlet_cfg, "5Nobody", True, "ok")
    with pytest.raises(ValueError, match="status"):
        book.record_fast_eval(gauntlet_cfg, "5Alice", True, "")


def test_record_primary_applies_mu_and_one_match() -> None:
    book = ScoreBook()
    for uid, hotkey in enumerate(("a", "b")):
        book.get_or_create(hotkey, uid, window=0)
    book.record_primary(RULES, {"a": PrimaryResult(0.03, 0.02), "b": PrimaryResult(0.005, 0.01)})
    a, b = book.peers["a"], book.peers["b"]
    # μ: a = 0.1·(+1) = 0.1, b = 0.1·(−1) = −0.1; rating: the two-player hand values of test_rating
    assert a.mu == pytest.approx(0.1, abs=1e-15) and b.mu == pytest.approx(-0.1, abs=1e-15)
    assert a.rating[0] == pytest.approx(27.635389, abs=1e-6) and b.rating[0] == pytest.approx(22.364611, abs=1e-6)
    # score a = μ·LossRating = 0.1 · 27.635389 = 2.7635389; b: μ < 0 floored → 0
    assert a.score == pytest.approx(2.7635389, abs=1e-6) and b.score == 0.0
    assert (a.last_delta_assigned, a.last_delta_rand, a.primary_evals) == (0.03, 0.02, 1)


def test_record_primary_judges_gaps_against_the_window_median() -> None:
    """Three honest peers set the window's LossScore scale (median 0.05); a noise peer whose tiny δs
    differ by "200 % of themselves" earns nothing, where its own scale would have counted +1."""
    book = ScoreBook()
    results = {
        "h1": PrimaryResult(0.07, 0.03), "h2": PrimaryResult(0.08, 0.04), "h3": PrimaryResult(0.06, 0.02),
        "noise": PrimaryResult(0.0012, -0.0013),
    }
    for uid, hotkey in enumerate(results):
        book.get_or_create(hotkey, uid, window=0)
    assert window_loss_scale(results.values()) == pytest.approx((0.04 + 0.05) / 2)
    book.record_primary(RULES.model_copy(update={"mu_gamma": 0.7, "proof_margin": 0.3}), results)
    assert book.peers["noise"].mu == 0.0
    assert all(book.peers[h].mu == pytest.approx(0.3) for h in ("h1", "h2", "h3"))
    assert window_loss_scale([PrimaryResult(-math.inf, 0.1)]) == 0.0


def test_the_book_judges_gaps_by_its_windows_history_and_keeps_it() -> None:
    """Credit by size measures each gap against the median of the last 16 windows' own medians,
    kept in the saved book: a window whose S_t happened to be mostly page-skippers (own median ≈ 0)
    does not turn a skipper's noise into credit, as that window's median alone would."""
    honest = {f"h{i}": PrimaryResult(0.05 + 0.02, 0.05) for i in range(3)}  # gap 0.02 each
    skippers = {"h0": PrimaryResult(0.07, 0.05), **{f"s{i}": PrimaryResult(0.0502 + 0.0001 * i, 0.05)
                                                   for i in range(3)}}
    uids = {hotkey: uid for uid, hotkey in enumerate(sorted({*honest, *skippers}))}
    by_size = RULES.model_copy(update={"proof_credit": "size", "proof_full_gap": 0.4})
    assert (by_size.proof_gap_history, by_size.proof_gap_floor) == (16, 0.02)  # production's

    def run(book: ScoreBook, windows: list[tuple[int, dict[str, PrimaryResult]]]) -> ScoreBook:
        for window, results in windows:
            for hotkey in results:
                book.get_or_create(hotkey, uids[hotkey], window=window)
            book.record_primary(by_size, results, window=window)
        return book

    with_history = run(ScoreBook(), [(w, honest) for w in range(4)] + [(4, skippers)])
    assert list(with_history.proof_gaps) == [(w, pytest.approx(0.02)) for w in range(4)] + [(4, pytest.approx(0.00035))]
    alone = run(ScoreBook(), [(4, skippers)])  # no history: the skippers' own median is the scale
    # gap 0.0003 against 0.4 × 0.02 earns 0.0375; against the skippers' own scale (their median
    # 0.00035, lifted to the floor: 2 % of the window's LossScore size) it earned 0.75
    assert with_history.peers["s1"].mu == pytest.approx(0.1 * 0.0003 / (0.4 * 0.02))
    floor = by_size.proof_gap_floor * window_loss_scale(skippers.values())
    assert alone.peers["s1"].mu == pytest.approx(0.1 * 0.0003 / (0.4 * floor)) and alone.peers["s1"].mu > 0.07
    restored = ScoreBook.from_json(with_history.to_json())
    assert restored == with_history and list(restored.proof_gaps) == list(with_history.proof_gaps)
    # a validator back from a long stop judges by the windows since, not by what it saw before
    stopped = run(ScoreBook(), [(w, honest) for w in range(4)] + [(4 + 100, skippers)])
    assert stopped.peers["s1"].mu == pytest.approx(alone.peers["s1"].mu)
    run(with_history, [(w, honest) for w in range(5, 25)])
    assert len(with_history.proof_gaps) == 15  # this window's median and 15 earlier ones
    old = json.loads(with_history.to_json())  # a book written before the history existed
    del old["proof_gaps"]
    assert not ScoreBook.from_json(json.dumps(old)).proof_gaps
    for bad in ([[w, 0.02] for w in range(HISTORY_LIMIT + 1)], [[-1, 0.02]], [[3, "inf"]]):
        old["proof_gaps"] = bad
        with pytest.raises(ScoreBookError, match="proof_gaps"):
            ScoreBook.from_json(json.dumps(old))


def test_record_primary_is_all_or_nothing() -> None:
    book = ScoreBook()
    book.get_or_create("a", 0, window=0)
    before = book.to_json()
    with pytest.raises(KeyError):
        book.record_primary(RULES, {"a": PrimaryResult(0.1, 0.0), "ghost": PrimaryResult(0.1, 0.0)})
    with pytest.raises(ValueError, match="NaN"):
        book.record_primary(RULES, {"a": PrimaryResult(math.nan, 0.0)})
    assert book.to_json() == before


def test_negative_times_negative_exploit_earns_nothing(gauntlet_cfg: GauntletConfig) -> None:
    book = ScoreBook()
    honest = book.get_or_create("5Honest", 0, window=0)
    honest.mu, honest.rating = 0.4, (30.0, 3.0)  # 0.4 · 30 = 12
    cheat = book.get_or_create("5Cheat", 1, window=0)
    cheat.mu, cheat.rating = -0.8, (-5.0, 6.0)  # raw product (−0.8)·(−5) would be +4.0
    assert book.scores(gauntlet_cfg) == {"5Cheat": 0.0, "5Honest": pytest.approx(12.0)}
    assert book.top_g(gauntlet_cfg) == ["5Honest"]
    assert book.weights(gauntlet_cfg) == {"5Cheat": 0.0, "5Honest": 1.0}


def test_weights_sum_to_one_and_are_stored() -> None:
    book = _populated_book()
    weights = book.weights(RULES)
    assert math.fsum(weights.values()) == pytest.approx(1.0, abs=1e-12)
    assert all(book.peers[hk].weight == w for hk, w in weights.items())
    assert book.top_g(RULES.model_copy(update={"top_g": 2}))[0] == max(weights, key=weights.__getitem__)


# ---- persistence --------------------------------------------------------------------------------


def test_json_round_trip_is_exact() -> None:
    book = _populated_book()
    text = book.to_json()
    again = ScoreBook.from_json(text)
    assert again == book
    assert again.to_json() == text
    assert again.peers["5Alice"].last_delta_assigned == 0.1 + 0.2
    assert again.peers["5Alice"].last_delta_rand == 1e-300
    assert again.peers["5Bob"].last_delta_assigned == -math.inf
    assert again.peers["5Bob"].last_sync_steps == math.inf
    assert json.loads(text)["version"] == 1


def test_save_load_round_trip_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "state" / "scorebook.json"
    assert len(ScoreBook.load(path)) == 0
    book = _populated_book()
    book.save(path)
    assert ScoreBook.load(path) == book
    assert [p.name for p in path.parent.iterdir()] == ["scorebook.json"]  # no temp file left


def _corrupt(text: str, peer: str, field: str, value: object) -> str:
    data = json.loads(text)
    data["peers"][peer][field] = value
    return json.dumps(data)


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda t: t[: len(t) // 2], "json"),
        (lambda t: t.replace('"version": 1', '"version": 2'), "version"),
        (lambda t: _corrupt(t, "5Alice", "mu", 1.5), "mu"),
        (lambda t: _corrupt(t, "5Alice", "uid", "3"), "uid"),
        (lambda t: _corrupt(t, "5Alice", "surprise", 1), "surprise"),
        (lambda t: _corrupt(t, "5Alice", "rating", [25.0, -1.0]), "rating"),
        (lambda t: _corrupt(t, "5Alice", "uid", 1), "uid 1"),
        (lambda t: _corrupt(t, "5Alice", "first_seen_window", 10**6), "first_seen_window"),
        (lambda t: t.replace('"last_sync_steps": 0.3333333333333333', '"last_sync_steps": NaN'), "last_sync"),
        (lambda t: t.replace('"last_delta_assigned": -Infinity', '"last_delta_assigned": NaN'), "NaN"),
    ],
)
def test_corrupt_file_raises_a_clear_error(tmp_path: Path, mutate, needle: str) -> None:
    path = tmp_path / "scorebook.json"
    text = _populated_book().to_json()
    bad = mutate(json.dumps(json.loads(text), indent=1))
    assert bad != text
    path.write_text(bad)
    with pytest.raises(ScoreBookError, match=str(path)) as info:
        ScoreBook.load(path)
    assert needle.lower() in str(info.value).lower()


def test_invalid_in_memory_state_is_never_written(tmp_path: Path) -> None:
    path = tmp_path / "scorebook.json"
    book = _populated_book()
    book.save(path)
    book.peers["5Alice"].mu = math.nan  # a bug elsewhere corrupts a record
    with pytest.raises(ValueError, match="mu"):
        book.save(path)
    assert ScoreBook.load(path) == _populated_book()
    with pytest.raises(ValueError, match="hotkey"):
        ScoreBook().get_or_create("5" * 65, 0, window=0)


def test_failed_save_leaves_previous_file_intact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "scorebook.json"
    first = _populated_book()
    first.save(path)
    second = _populated_book()
    second.forget("5Alice")

    def broken_fsync(fd: int) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="disk on fire"):
        second.save(path)
    monkeypatch.undo()
    assert ScoreBook.load(path) == first
    assert [p.name for p in tmp_path.iterdir()] == ["scorebook.json"]


_WRITER = textwrap.dedent(
    """
    import sys
    from templar.core.config import load_hparams
    from templar.gauntlet import PrimaryResult, ScoreBook

    path = sys.argv[1]
    rules = load_hparams().gauntlet
    book = ScoreBook()
    window = 0
    while True:
        window += 1
        hotkeys = [f"5Peer{(window + i) % 64:02d}" for i in range(4)]
        for hotkey in hotkeys:
            book.get_or_create(hotkey, int(hotkey[5:]), window)
        book.record_primary(rules, {h: PrimaryResult(0.01 * i, 0.005 * i) for i, h in enumerate(hotkeys)})
        book.save(path)
        if window == 3:
            print("saving", flush=True)
    """
)


def test_kill_9_during_saves_never_leaves_a_torn_file(tmp_path: Path) -> None:
    path = tmp_path / "scorebook.json"
    child = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "saving"
        time.sleep(0.4)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    assert child.returncode == -signal.SIGKILL
    book = ScoreBook.load(path)
    assert len(book) >= 4
    assert all(record.primary_evals >= 1 for record in book.peers.values())


def test_a_pool_splits_one_score_and_holds_one_top_g_slot() -> None:
    """Pools (docs/scoring.md §8): hotkeys found sharing work are paid one member's score between them (each
    its score / pool size) and only the best of them can enter the top-G; the pool is forgotten `pool_memory`
    windows after it was last seen."""
    rules = RULES.model_copy(update={"mu_gamma": 0.5, "openskill_beta": 4.1667, "openskill_tau": 0.0833, "top_g": 4})
    memory = rules.pool_memory
    book = ScoreBook()
    for uid, hotkey in enumerate(["a", "b", "c", "h"]):
        book.get_or_create(hotkey, uid, 0)
    results = {hk: PrimaryResult(0.02, 0.01) for hk in ("a", "b", "c", "h")}
    book.record_primary(rules, results)
    alone = book.scores(rules)
    assert len(set(alone.values())) == 1  # everyone did the same: one score
    book.record_pool(rules, ["a", "b", "c"], window=3)
    pooled = book.scores(rules)
    for hotkey in "abc":
        assert pooled[hotkey] == pytest.approx(alone[hotkey] / 3)
    assert pooled["h"] == alone["h"]
    weights = book.weights(rules)
    assert sum(weights[h] for h in "abc") < weights["h"]  # 3·(s/3)² < s²
    assert book.top_g(rules) == ["h", "a"]  # one slot for the pool (ties by hotkey)
    restored = ScoreBook.from_json(book.to_json())
    assert restored.pools() == book.pools() and restored.top_g(rules) == ["h", "a"]
    book.expire_pools(rules, 3 + memory)
    assert book.pools()
    book.expire_pools(rules, 4 + memory)
    assert not book.pools() and book.scores(rules) == alone
