"""A validator's memory of recent uploads' content digests: yesterday's work re-posted today is `replay`.

Nothing in a payload's fast checks ties its tensors to the window they claim: a miner can re-sign
an update it uploaded a few windows ago (or any peer's public upload of an earlier window) with
this window's number, step and fresh probes, commit to that document before the deadline, and
pass the commitment, step and sync checks with no work done. The copy check compares uploads of
one window only. So each validator remembers, for the last `replay_windows` windows (the run's
rules, `gauntlet.replay_windows`), the content
digest (`Gradient.digest`: the gradient tensors only, whoever signed them) of every payload its
gather returned valid, and a payload whose digest was seen in an *earlier* window fails fast
evaluation as `replay`, whichever hotkey posted it first.

Honest uploads never repeat: each window's update comes from new pages on a model one outer step
further, so equal digests across windows mean the same bytes re-posted. The one exception is an
update with no work in it: an all-zero update encodes to the same bytes every time (zero values at
the lowest indices), so it is neither checked nor remembered; it earns nothing anyway (δ = 0) and
is penalised by the rules that see it (μ decays). Uploads of the same window are the copy check's
(`templar.gauntlet.find_pools`), so a window never matches itself, and a window that is redone after
a restart finds nothing of its own in the memory (it is saved with the state, at the window's commit
point).

The memory travels in the validator's state file beside the score book (`templar.validator.state`),
so a restart, `kill -9` included, keeps it; a validator that starts from the lead's checkpoint
instead of its own state starts with an empty one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from templar.comms import GatherResult
from templar.core.log import context, short
from templar.wire import Gradient

MAX_DIGESTS_PER_WINDOW = 4096
"""A bound on what one window adds, far above any gather (`fast_eval_uids` + top-G)."""

_DIGEST = re.compile(r"^[0-9a-f]{64}$")


class ReplayMemoryError(ValueError):
    """A saved memory that cannot be read back (a damaged state file)."""


@dataclass(frozen=True)
class Sighting:
    """Where a content digest was seen first: the hotkey that uploaded it and the window."""

    hotkey: str
    window: int


def carries_work(g: Gradient) -> bool:
    """Whether any value of the update is non-zero: an all-zero update encodes identically every
    window, so its digest proves nothing about where it came from."""
    return any(bool(c.values.any()) for c in g.tensors.values())


class ReplayMemory:
    """Content digests of the valid uploads of the last `windows` windows, per window (64 in
    production, about 90 minutes: a replay of anything older escapes this check, but an update that
    old was computed on a model 64 outer steps behind, which the sync check, the LossScore and μ
    do not pay)."""

    def __init__(self, windows: int) -> None:
        self.windows = windows
        self.seen: dict[int, dict[bytes, str]] = {}
        """Window → content digest → the hotkey that uploaded it (the smallest, if several did)."""

    def __len__(self) -> int:
        return sum(len(d) for d in self.seen.values())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ReplayMemory) and (self.windows, self.seen) == (other.windows, other.seen)

    def first_sighting(self, digest: bytes, before: int) -> Sighting | None:
        """The earliest remembered upload of `digest` in a window before `before`, None if none."""
        for window in sorted(w for w in self.seen if w < before):
            if (hotkey := self.seen[window].get(digest)) is not None:
                return Sighting(hotkey, window)
        return None

    def observe(self, window: int, results: Mapping[str, GatherResult[Gradient]]) -> dict[str, Sighting]:
        """The uploads of `window` that repeat an earlier window's (hotkey → first sighting), each
        logged; then remembers `window`'s own and forgets windows older than the memory's span."""
        log = context(window=window, phase="fast")
        fresh: dict[bytes, str] = {}
        replayed: dict[str, Sighting] = {}
        for hotkey, res in sorted(results.items()):
            g = res.value
            if not res.ok or g is None or not carries_work(g):
                continue
            if (first := self.first_sighting(g.digest, window)) is not None:
                replayed[hotkey] = first
                whose = "its own" if first.hotkey == hotkey else f"{short(first.hotkey)}'s"
                log.warning(f"peer {short(hotkey)}: replay: its gradient is byte-identical to {whose} upload of "
                            f"window {first.window} ({window - first.window} windows ago)")
            if len(fresh) < MAX_DIGESTS_PER_WINDOW:
                fresh.setdefault(g.digest, hotkey)
        if fresh:
            self.seen.setdefault(window, {})
            for digest, hotkey in fresh.items():
                self.seen[window].setdefault(digest, hotkey)
        self.forget_before(window - self.windows + 1)
        return replayed

    def forget_before(self, window: int) -> None:
        for old in [w for w in self.seen if w < window]:
            del self.seen[old]

    def to_json(self) -> dict[str, object]:
        return {"windows": self.windows,
                "seen": {str(w): {d.hex(): hk for d, hk in sorted(self.seen[w].items())} for w in sorted(self.seen)}}

    @classmethod
    def from_json(cls, data: object, windows: int) -> ReplayMemory:
        """The memory `to_json` saved, spanning `windows` (the run's `replay_windows`: a memory
        saved with a longer span keeps only its newest windows); `ReplayMemoryError` for anything
        else (checked field by field: the state file is our own, but a damaged one must not crash
        the validator)."""
        if not isinstance(data, dict) or set(data) != {"windows", "seen"}:
            raise ReplayMemoryError("not a replay memory")
        saved, seen = data["windows"], data["seen"]
        if type(saved) is not int or not 0 < saved <= 10_000 or not isinstance(seen, dict):
            raise ReplayMemoryError("bad span or windows")
        memory = cls(windows)
        for key, digests in seen.items():
            if not isinstance(key, str) or not key.isdigit() or not isinstance(digests, dict):
                raise ReplayMemoryError(f"bad window {str(key)[:20]!r}")
            if len(digests) > MAX_DIGESTS_PER_WINDOW:
                raise ReplayMemoryError(f"window {key}: {len(digests)} digests")
            entry: dict[bytes, str] = {}
            for digest, hotkey in digests.items():
                if not isinstance(digest, str) or not _DIGEST.match(digest):
                    raise ReplayMemoryError(f"window {key}: bad digest")
                if not isinstance(hotkey, str) or not 0 < len(hotkey) <= 128:
                    raise ReplayMemoryError(f"window {key}: bad hotkey")
                entry[bytes.fromhex(digest)] = hotkey
            memory.seen[int(key)] = entry
        if len(memory.seen) > saved:
            raise ReplayMemoryError(f"{len(memory.seen)} windows saved, span {saved}")
        if memory.seen:
            memory.forget_before(max(memory.seen) - windows + 1)
        return memory
