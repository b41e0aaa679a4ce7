"""Tokens, pages and the deterministic assignment of pages to miners.

A *page* is `sequences_per_page` packed sequences of `sequence_length` tokens. Which pages a
miner must train on in a window is a pure function of (seed, uid, window): every validator and
miner computes the same answer with no communication, on any machine and torch/numpy version,
because the permutation is a keyed Feistel network over blake2b (not a library RNG whose stream
may change between releases).

Why slots come from the uid and not from a hash of the hotkey: hashing hotkeys into a finite
page pool collides by the birthday bound (256 hotkeys over a few thousand slots collide almost
surely), while the chain guarantees uids are unique, so uid slots are disjoint by construction.
Pages past every uid's slot are never assigned to anyone in that window; `random_pages` draws
from there, so a validator's "random" data is unassigned for every peer.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

MAX_UIDS = 256
"""Slots reserved per window for assigned pages (Bittensor subnets have at most 256 uids)."""

_FEISTEL_ROUNDS = 6


def _round_key(seed: int, label: str, window: int) -> bytes:
    return hashlib.blake2b(f"{seed}|{label}|{window}".encode(), digest_size=16).digest()


def _feistel(index: int, domain: int, key: bytes) -> int:
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


@dataclass(frozen=True)
class PagePlan:
    """How the pages of one corpus split into a training pool and a held-out set."""

    num_pages: int
    holdout: int
    seed: int
    pages_per_uid: int

    @classmethod
    def build(cls, num_pages: int, holdout_fraction: float, seed: int, pages_per_uid: int) -> PagePlan:
        if num_pages < 2:
            raise ValueError(f"corpus has {num_pages} pages; need at least 2")
        holdout = max(1, int(num_pages * holdout_fraction)) if holdout_fraction > 0 else 0
        return cls(num_pages=num_pages, holdout=holdout, seed=seed, pages_per_uid=pages_per_uid)

    @property
    def pool(self) -> int:
        return self.num_pages - self.holdout

    def _page_of_pool_index(self, i: int) -> int:
        return _feistel(i, self.num_pages, _round_key(self.seed, "split", 0))

    def holdout_pages(self) -> list[int]:
        """Never assigned, never random: the held-out set for the run's loss curve."""
        return [self._page_of_pool_index(self.pool + i) for i in range(self.holdout)]

    def _permuted(self, label: str, window: int, position: int) -> int:
        key = _round_key(self.seed, label, window)
        return self._page_of_pool_index(_feistel(position % self.pool, self.pool, key))

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

    def random_pages(self, window: int, n: int, *, salt: int = 0, exclude: Iterable[int] = ()) -> list[int]:
        """`n` distinct pages from past every uid's slot in `window`, minus `exclude`.

        `salt` gives independent draws within one window (e.g. one per evaluated peer).
        """
        excluded = set(exclude)
        reserved = MAX_UIDS * self.pages_per_uid
        start = reserved if reserved + n * 4 <= self.pool else 0
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


# --------------------------------------------------------------------------------------------
# Tokens on disk


_CORPUS_SUFFIXES = {".txt", ".jsonl", ".json", ".parquet"}


def _visible_files(path: Path, suffixes: set[str] | None = None) -> list[Path]:
    """Files under `path`, skipping hidden names and directories (our own `.cache` lives there)."""
    if path.is_file():
        return [path]
    files = (p for p in path.rglob("*") if p.is_file()
             and not any(part.startswith(".") for part in p.relative_to(path).parts))
    return sorted(p for p in files if suffixes is None or p.suffix in suffixes)


def _documents(path: Path, text_field: str) -> Iterator[str]:
    """Documents from local text/jsonl/parquet files through HF datasets (offline)."""
    from datasets import load_dataset

    files = _visible_files(path, _CORPUS_SUFFIXES)
    if not files:
        raise FileNotFoundError(f"no .txt/.jsonl/.parquet files under {path}")
    kinds = {p.suffix for p in files}
    if len(kinds) != 1:
        raise ValueError(f"{path}: mixed file kinds {sorted(kinds)}; keep one format per dataset")
    kind = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}[kinds.pop()]
    ds = load_dataset(kind, data_files=[str(p) for p in files], split="train")
    column = "text" if kind == "text" else text_field
    for text in ds[column]:
        if text:
            yield text


def _file_fingerprint(path: Path) -> str:
    h = hashlib.sha256()
    for p in _visible_files(path):
        st = p.stat()
        h.update(f"{p.relative_to(path.parent)}|{st.st_size}|{int(st.st_mtime)}".encode())
    return h.hexdigest()[:16]


class PageStore:
    """Packed tokens of one corpus, cut into pages; `page(i)` is a [sequences, length] tensor."""

    def __init__(self, tokens: np.ndarray, sequence_length: int, sequences_per_page: int, *, seed: int = 0):
        self.tokens = tokens
        self.sequence_length = sequence_length
        self.sequences_per_page = sequences_per_page
        self.num_sequences = len(tokens) // sequence_length
        self.num_pages = self.num_sequences // sequences_per_page
        self._key = _round_key(seed, "sequences", 0)

    def page(self, index: int) -> torch.Tensor:
        """The page's sequences, spread over the corpus by a fixed permutation.

        Contiguous pages would each hold one source (a play, a run of encyclopaedia articles);
        spreading them makes every page a sample of the whole corpus, which keeps the LossScores
        of different pages comparable (less noise in δ_assigned − δ_rand).
        """
        if not 0 <= index < self.num_pages:
            raise IndexError(f"page {index} outside [0, {self.num_pages})")
        rows = []
        for j in range(self.sequences_per_page):
            seq = _feistel(index * self.sequences_per_page + j, self.num_sequences, self._key)
            start = seq * self.sequence_length
            rows.append(np.asarray(self.tokens[start:start + self.sequence_length], dtype=np.int64))
        return torch.from_numpy(np.stack(rows))

    def batch(self, pages: Iterable[int]) -> torch.Tensor:
        """All sequences of several pages stacked: [len(pages)*sequences_per_page, length]."""
        return torch.cat([self.page(i) for i in pages], dim=0)

    @classmethod
    def from_corpus(cls, corpus: str | Path, tokenizer_path: str | Path, *, text_field: str,
                    sequence_length: int, sequences_per_page: int, seed: int = 0) -> PageStore:
        """Tokenize a local corpus once (cached beside it) and pack it into pages."""
        tokens = tokenize_corpus(Path(corpus), Path(tokenizer_path), text_field=text_field)
        return cls(tokens, sequence_length, sequences_per_page, seed=seed)


def load_tokenizer(path: str | Path):
    """A local tokenizer directory loaded with `AutoTokenizer` (no hub access)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def tokenize_corpus(corpus: Path, tokenizer_path: Path, *, text_field: str = "text") -> np.ndarray:
    """Concatenated token ids of every document with EOS between them, cached as .npy."""
    fingerprint = hashlib.sha256(
        (_file_fingerprint(corpus) + _file_fingerprint(tokenizer_path) + text_field).encode()
    ).hexdigest()[:16]
    cache_dir = (corpus if corpus.is_dir() else corpus.parent) / ".cache"
    cache = cache_dir / f"tokens-{fingerprint}.npy"
    if cache.exists():
        return np.load(cache, mmap_mode="r")
    tokenizer = load_tokenizer(tokenizer_path)
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError(f"tokenizer at {tokenizer_path} has no eos token")
    dtype = np.uint16 if len(tokenizer) <= np.iinfo(np.uint16).max else np.uint32
    parts: list[np.ndarray] = []
    batch: list[str] = []

    def flush() -> None:
        for ids in tokenizer(batch, add_special_tokens=False)["input_ids"]:
            parts.append(np.asarray([*ids, eos], dtype=dtype))
        batch.clear()

    for doc in _documents(corpus, text_field):
        batch.append(doc)
        if len(batch) == 1024:
            flush()
    if batch:
        flush()
    tokens = np.concatenate(parts)
    cache_dir.mkdir(parents=True, exist_ok=True)
    # Many processes may tokenize at once (a localnet's neurons): each writes its own temp file and
    # renames it atomically; the contents are identical, so whichever rename lands last is fine.
    tmp = cache.with_name(f"{cache.stem}.{os.getpid()}.{secrets.token_hex(4)}.tmp.npy")
    np.save(tmp, tokens)
    os.replace(tmp, cache)
    (cache_dir / f"tokens-{fingerprint}.json").write_text(
        json.dumps({"tokens": len(tokens), "tokenizer": str(tokenizer_path)})
    )
    return np.load(cache, mmap_mode="r")
