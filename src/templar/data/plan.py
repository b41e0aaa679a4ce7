"""The deterministic assignment of pages to miners.

A *page* is `sequences_per_page` packed sequences of `sequence_length` tokens, stored
contiguously in a token shard (`templar.data.manifest`). Which pages a
miner must train on in a window is a pure function of (seed, uid, window): every validator and
miner computes the same answer with no communication, on any machine and torch/numpy version,
because the permutation is a keyed Feistel network over blake2b (not a library RNG whose stream
may change between releases).

Why slots come from the uid and not from a hash of the hotkey: hashing hotkeys into a finite
page pool collides by the birthday bound (256 hotkeys over a few thousand slots collide almost
surely), while the chain guarantees uids are unique, so uid slots are disjoint by construction.
Behind the assigned slots come the declared slots (`declared_pages`): a miner that takes more pages
than assigned declares how many in its signed payload, and which pages those are is again a pure
function, of (seed, uid, window, count): the first `count` positions of its uid's declared slot. No
one chooses its own extra pages, and no two uids' declared pages overlap each other or anyone's
assigned ones (on a corpus large enough, as for assignment). Pages past every uid's slots, assigned
and declared, are given to no one in that window; `random_pages` draws from there, so a validator's
"random" data is untrained by every peer.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

MAX_UIDS = 256
"""Slots reserved per window for assigned pages (Bittensor subnets have at most 256 uids)."""

_FEISTEL_ROUNDS = 6


def round_key(seed: int, label: str, window: int) -> bytes:
    return hashlib.blake2b(f"{seed}|{label}|{window}".encode(), digest_size=16).digest()


def feistel(index: int, domain: int, key: bytes) -> int:
    """A keyed permutation of range(domain): balanced Feistel with cycle walking."""
    bits = max(2, (domain - 1).bit_length())
    bits += bits % 2
    half = bits // 2
    mask = (1 << half) - 1
    x = index
    while True:
        left, right = x >> half, x & mask
        for r in range(_FEISTEL_ROUNDS):
            digest = hashlib.blake2b(right.to_bytes(8, "little") + bytes([r]), key=key, digest_size=8)
            left, right = right, left ^ (int.from_bytes(digest.digest(), "little") & mask)
        x = (left << half) | right
        if x < domain:
            return x


def holdout_count(num_pages: int, holdout_fraction: float) -> int:
    """Pages of a corpus kept out of assignment for the held-out loss (at least one if any)."""
    return max(1, int(num_pages * holdout_fraction)) if holdout_fraction > 0 else 0


def disjoint_assignment_pages(pages_per_window: int, holdout_fraction: float) -> int:
    """The fewest corpus pages for which no two uids' assignments of a window overlap: every one
    of the `MAX_UIDS` slots of `pages_per_window` pages fits in the pool outside the held-out set."""
    needed = MAX_UIDS * pages_per_window
    pages = needed
    while pages - holdout_count(pages, holdout_fraction) < needed:
        pages += 1
    return pages


@dataclass(frozen=True)
class PagePlan:
    """How the pages of one corpus split into a training pool and a held-out set."""

    num_pages: int
    holdout: int
    seed: int
    pages_per_uid: int
    declared_per_uid: int = 0
    """Positions of each uid's declared slot (the run's `data.max_extra_pages`)."""

    @classmethod
    def build(cls, num_pages: int, holdout_fraction: float, seed: int, pages_per_uid: int,
              declared_per_uid: int = 0) -> PagePlan:
        if num_pages < 2:
            raise ValueError(f"corpus has {num_pages} pages; need at least 2")
        if declared_per_uid < 0:
            raise ValueError(f"declared_per_uid must be >= 0, got {declared_per_uid}")
        holdout = holdout_count(num_pages, holdout_fraction)
        return cls(num_pages=num_pages, holdout=holdout, seed=seed, pages_per_uid=pages_per_uid,
                   declared_per_uid=declared_per_uid)

    @property
    def pool(self) -> int:
        return self.num_pages - self.holdout

    def _page_of_pool_index(self, i: int) -> int:
        return feistel(i, self.num_pages, round_key(self.seed, "split", 0))

    def holdout_pages(self) -> list[int]:
        """Never assigned, never random: the held-out set for the run's loss curve."""
        return [self._page_of_pool_index(self.pool + i) for i in range(self.holdout)]

    def _permuted(self, label: str, window: int, position: int) -> int:
        key = round_key(self.seed, label, window)
        return self._page_of_pool_index(feistel(position % self.pool, self.pool, key))

    def assigned_pages(self, uid: int, window: int, n: int) -> list[int]:
        """The `n` pages uid `uid` must train on in `window`; disjoint across uids.

        Disjointness needs `MAX_UIDS * n <= pool`; smaller corpora wrap around (tiny test corpora
        with few miners still get disjoint pages among the first `pool // n` uids).
        """
        if not 0 <= uid < MAX_UIDS:
            raise ValueError(f"uid {uid} outside [0, {MAX_UIDS})")
        if n > self.pages_per_uid:
            raise ValueError(f"asked for {n} pages; a uid slot holds {self.pages_per_uid}")
        return [self._permuted("window", window, uid * self.pages_per_uid + i) for i in range(n)]

    def declared_pages(self, uid: int, window: int, n: int) -> list[int]:
        """The `n` pages beyond its assigned ones that uid `uid` trains on in `window` when it declares
        `n` (`--extra-pages`): the first `n` positions of its declared slot, behind every uid's
        assigned slot. A pure function of public inputs, so a validator draws its proof of computation
        from exactly the pages the miner declared, and a miner cannot pick pages it likes (or pages
        another uid trains)."""
        if not 0 <= uid < MAX_UIDS:
            raise ValueError(f"uid {uid} outside [0, {MAX_UIDS})")
        if not 0 <= n <= self.declared_per_uid:
            raise ValueError(f"declared {n} extra pages; the run allows 0 to {self.declared_per_uid}")
        start = MAX_UIDS * self.pages_per_uid + uid * self.declared_per_uid
        return [self._permuted("window", window, start + i) for i in range(n)]

    def random_pages(self, window: int, n: int, *, salt: int = 0, exclude: Iterable[int] = ()) -> list[int]:
        """`n` distinct pages from past every uid's slots (assigned and declared) in `window`, minus
        `exclude`.

        `salt` gives independent draws within one window (e.g. one per evaluated peer).
        """
        excluded = set(exclude)
        # past the assigned and declared slots; on a corpus too small for both, past the assigned ones
        # (a declared page is then also someone's assigned page); on a tiny test corpus, anywhere
        fits = [r for r in (MAX_UIDS * (self.pages_per_uid + self.declared_per_uid), MAX_UIDS * self.pages_per_uid)
                if r + n * 4 <= self.pool]
        start = fits[0] if fits else 0
        span = self.pool - start  # positions past every uid's slot; a salt never wraps into them
        out: list[int] = []
        for j in range(span):
            page = self._permuted("window", window, start + (salt * n + j) % span)
            if page not in excluded and page not in out:
                out.append(page)
                if len(out) == n:
                    break
        return out


def assigned_pages(seed: int, uid: int, window: int, n: int, num_pages: int,
                   holdout_fraction: float = 0.0) -> list[int]:
    """Pure function form of `PagePlan.assigned_pages` (slot size `n`)."""
    return PagePlan.build(num_pages, holdout_fraction, seed, n).assigned_pages(uid, window, n)


def random_pages(seed: int, window: int, n: int, num_pages: int, *, pages_per_uid: int,
                 exclude: Iterable[int] = (), holdout_fraction: float = 0.0) -> list[int]:
    """Pure function form of `PagePlan.random_pages`."""
    plan = PagePlan.build(num_pages, holdout_fraction, seed, pages_per_uid)
    return plan.random_pages(window, n, exclude=exclude)
