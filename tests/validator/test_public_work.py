"""The validator's memory of earlier windows' aggregated uploads (the borrowed-work references):
bounded to the last `public_windows` windows (the run's rules), warm-up payloads left out, only windows before the
one asked about."""

from __future__ import annotations

from templar.core.config import load_hparams
from templar.validator.public_work import PublicWork
from templar.wire import Gradient


def _g(hotkey: str, window: int, warmup: bool = False) -> Gradient:
    return Gradient(window=window, global_step=window, hotkey=hotkey, warmup=warmup, tensors={}, probes={},
                    digest=hotkey.encode(), nbytes=0)


def test_public_work_keeps_the_last_windows_aggregated_uploads_only() -> None:
    windows = load_hparams().gauntlet.public_windows
    assert windows == 2  # production's
    memory = PublicWork(windows, max_per_window=2)
    for window in (3, 4, 5):
        memory.remember(window, [_g("a", window), _g("b", window, warmup=True), _g("c", window), _g("d", window)])
    assert sorted(memory.before(6)) == [4, 5]
    assert sorted(memory.before(6)[5]) == ["a", "c"]  # warm-up is no work; at most max_per_window kept
    assert sorted(memory.before(5)) == [4]  # window 3 is forgotten; a window is never its own reference
    assert memory.before(4) == {}
    assert PublicWork(windows).before(10) == {}  # a restarted validator has nothing
