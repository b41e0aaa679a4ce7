"""Deterministic peer selection: S_t for primary evaluation, F_t for fast evaluation (Algorithm 1).

Each candidate gets a pseudo-random priority `blake2b(hotkey, key=H(seed, window, purpose))`;
the lowest priorities win. Priorities depend only on the (seed, window, purpose, hotkey)
tuple, so every machine computes the same subset, the input order is irrelevant, a peer cannot
choose its own odds (it does not know the seed before the window), and a peer joining or
leaving never reshuffles the others' relative order.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping


def _window_key(seed: int, window: int, purpose: str) -> bytes:
    return hashlib.blake2b(f"templar/select/{purpose}/{seed}/{window}".encode(), digest_size=32).digest()


def _priority(key: bytes, hotkey: str) -> bytes:
    return hashlib.blake2b(hotkey.encode(), key=key, digest_size=16).digest()


def selection_priority(seed: int, window: int, hotkey: str, purpose: str = "eval") -> bytes:
    """The keyed hash that orders `hotkey` in this window's draw (lower = picked first)."""
    return _priority(_window_key(seed, window, purpose), hotkey)


def select_eval_peers(
    seed: int,
    window: int,
    candidates: Iterable[str],
    n: int,
    always: Iterable[str] = (),
    *,
    purpose: str = "eval",
    staleness: Mapping[str, float] | None = None,
    sharpness: float = 0.0,
) -> list[str]:
    """Pick up to `n` peers from `candidates` for this window, `always` ones included.

    `n` is the budget for the whole set: the `always` hotkeys (the current top-G, paper §3.3,
    so a failing aggregator is caught at once) take their places first and the rest is drawn at
    random; if `always` alone exceeds `n`, all of them are still returned. Hotkeys in `always`
    that are not candidates (deregistered) are ignored. Use a different `purpose` for S_t and
    F_t so the two draws in one window are independent. The result is in priority order.

    `staleness` with `sharpness` > 0 tilts the draw towards peers this validator has not
    evaluated for long (see `stale_first_priority`); without them every peer has equal odds.
    """
    if n < 0:
        raise ValueError(f"select_eval_peers: n must be non-negative, got {n}")
    if not sharpness >= 0 or not math.isfinite(sharpness):
        raise ValueError(f"select_eval_peers: sharpness must be finite and >= 0, got {sharpness!r}")
    pool = set(candidates)
    key = _window_key(seed, window, purpose)
    tilted = staleness is not None and sharpness > 0
    weights = _stale_weights(pool, staleness or {}, sharpness) if tilted else {}

    def priority(hotkey: str) -> tuple[float | bytes, str]:
        if tilted:
            return stale_first_priority(_priority(key, hotkey), weights[hotkey]), hotkey
        return _priority(key, hotkey), hotkey

    forced = sorted(pool.intersection(always), key=priority)
    drawn = sorted(pool.difference(forced), key=priority)[: max(0, n - len(forced))]
    return sorted(forced + drawn, key=priority)


def _stale_weights(pool: set[str], staleness: Mapping[str, float], sharpness: float) -> dict[str, float]:
    """Draw weight per peer: (windows since its last primary evaluation)^sharpness, at least 1.

    A peer missing from `staleness` was never evaluated (a newcomer): it counts as twice the
    stalest known peer, so newcomers are evaluated first without any one of them being certain.
    """
    known = [max(1.0, float(staleness[h])) for h in pool if h in staleness]
    newcomer = 2.0 * max(known, default=1.0)
    return {h: max(1.0, float(staleness[h])) ** sharpness if h in staleness else newcomer**sharpness
            for h in pool}


def stale_first_priority(digest: bytes, weight: float) -> float:
    """Weighted sampling without replacement by an exponential race (Efraimidis–Spirakis).

    The keyed digest gives a uniform u in (0, 1); the peer's arrival time is −ln(u)/weight and
    the earliest arrivals win. A peer of weight 2w is drawn first twice as often as one of
    weight w, but never with certainty: the draw stays keyed by the validator's private seed,
    so a miner still cannot know in which window it will be evaluated.
    """
    u = (int.from_bytes(digest[:8], "big") + 0.5) / 2.0**64
    return -math.log(u) / weight


def select_eval_pages(seed: int, window: int, uid: int, pages: list[int], n: int) -> list[int]:
    """The `n` of a peer's assigned `pages` that its LossScore is measured on, in assignment order.

    Keyed by the validator's secret `seed`: were it always the first page, a miner could train on
    that one alone and still pass the proof of computation with a fraction of the work.
    """
    if n < 0:
        raise ValueError(f"select_eval_pages: n must be non-negative, got {n}")
    if n >= len(pages):
        return list(pages)
    key = _window_key(seed, window, f"pages/{uid}")
    ranked = sorted(range(len(pages)), key=lambda i: (_priority(key, str(pages[i])), i))
    return [pages[i] for i in sorted(ranked[:n])]


def evaluated_pages(seed: int, window: int, uid: int, assigned: list[int], declared: list[int], n: int,
                    rule: str) -> list[int]:
    """The pages a peer's primary evaluation reads, its assigned ones first (`declared_pages_evaluated`).

    "shared": `n` drawn across `assigned` and `declared` alike, so a miner cannot tell which class is read.
    "in_proportion": `n` of `assigned` and ⌈n·|declared|/|assigned|⌉ of `declared` (at most all), each drawn
    apart: the declared class is proven in every evaluation on as much evidence, per page of work, as the
    assigned one, so how much of it was trained is told from its own few evaluations instead of from the
    evaluations that happened to draw it (a class's credit over a 16-window localnet's 9 evaluations
    scattered by a third and more, benchmarks/LOG.md §41). The miner still cannot tell which pages.

    "in_proportion_on_average": as "in_proportion", but n·|declared|/|assigned| is rounded by a draw keyed
    by the secret (up with the probability of its fraction), so a validator reads a peer's declared pages
    in proportion to the work they add on average. Rounded up, one declared page of 29 was read on as many
    pages as the assigned ones, and every peer declaring one page made its evaluations 1.5× as long for a
    thirtieth more work. The same count for twice the pages (a whole number).
    """
    if rule == "shared" or not declared:
        return select_eval_pages(seed, window, uid, assigned + declared, n)
    exact = n * len(declared) / max(1, len(assigned))
    if rule == "in_proportion":
        extra = math.ceil(exact)
    elif rule == "in_proportion_on_average":
        draw = int.from_bytes(_priority(_window_key(seed, window, f"declared/{uid}"), "round")[:8], "big") / 2.0**64
        extra = math.floor(exact) + (draw < exact - math.floor(exact))
    else:
        raise ValueError(f"evaluated_pages: unknown rule {rule!r}")
    extra = min(len(declared), extra)
    return select_eval_pages(seed, window, uid, assigned, n) + select_eval_pages(seed, window, uid, declared, extra)


def eval_sequences_read(per_page: int, n: int) -> int:
    """How many of an evaluated page's `per_page` sequences the proof of computation reads under
    `gauntlet.proof_sequences` = `n`: all of them when `n` is 0 or covers the page, else `n`. What
    the validator reads and what the subnet simulator draws production's evaluations at."""
    if n < 0 or per_page < 0:
        raise ValueError(f"eval_sequences_read: n and per_page must be non-negative, got {n}, {per_page}")
    return per_page if n == 0 or n >= per_page else n


def select_eval_sequences(seed: int, window: int, uid: int, page: int, per_page: int, n: int) -> list[int]:
    """The `n` of an evaluated page's `per_page` sequences (their indices, in page order) that the
    proof of computation reads (`gauntlet.proof_sequences`; all of them when `n` is 0 or covers
    the page).

    Keyed by the validator's secret `seed`, page by page: a miner cannot know which sequences
    count, so a miner that trains a share of them is read at that share in expectation, as when
    every sequence is read; fewer sequences make every pass of the evaluation smaller.
    """
    read = eval_sequences_read(per_page, n)
    if read == per_page:
        return list(range(per_page))
    key = _window_key(seed, window, f"sequences/{uid}/{page}")
    return sorted(sorted(range(per_page), key=lambda i: (_priority(key, str(i)), i))[:read])
