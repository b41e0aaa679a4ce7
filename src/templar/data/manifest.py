"""The corpus manifest: what a run's token shards hold, and how to check every page of them.

A prepared corpus is a folder or bucket prefix with this layout:

    manifest.json            canonical JSON of `Manifest` (its sha256 is the run's pinned digest)
    shards/00000.tok         raw little-endian uint16/uint32 tokens, whole pages only
    shards/00000.idx         sha256 of every page of that shard, 32 raw bytes per page

Trust flows down from the digest pinned in hparams: the manifest's bytes hash to it; the
manifest names each shard's size, sha256 and the sha256 of its page index; the index names
each page's sha256. So a node can verify the one page it fetched (256 KiB for the production
geometry) after one small index read per shard, without downloading the shard.

Why the page hashes live in per-shard index objects and not in the manifest: a 100B-token corpus
has ~760k pages; 32 bytes each would make a 24 MB manifest every node must parse at start. One
index per 128M-token shard is 32 KiB, read only when a page of that shard is first needed.

Why the manifest file *is* the canonical JSON: the digest is then simply sha256 of the bytes a
node downloaded, checked before a single field is parsed.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

FORMAT = "templar-tokens"
VERSION = 1
MANIFEST_KEY = "manifest.json"
MAX_MANIFEST_BYTES = 64 << 20
"""Cap on a manifest's size (a 1T-token corpus at 128M tokens per shard needs ~2 MB)."""
HASH_BYTES = 32

_HEX64 = r"^[0-9a-f]{64}$"
_SHARD_KEY = re.compile(r"shards/[0-9]{5,8}\.(tok|idx)")
DTYPES = {"uint16": 2, "uint32": 4}


class ManifestError(ValueError):
    """A manifest is unreadable, malformed, inconsistent or not the pinned one."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class TokenizerInfo(_Strict):
    """Which tokenizer made the tokens; `sha256` covers its whole definition (vocab, merges, normaliser)."""

    name: str = Field(min_length=1, max_length=200)
    sha256: str = Field(pattern=_HEX64)
    vocab_size: int = Field(gt=0, le=1 << 32)
    eos_id: int = Field(ge=0)


class ShardInfo(_Strict):
    """One token shard and its page index."""

    key: str = Field(max_length=64, description="shards/NNNNN.tok, relative to the corpus root")
    index_key: str = Field(max_length=64, description="shards/NNNNN.idx: sha256 of every page")
    pages: int = Field(gt=0)
    bytes: int = Field(gt=0)
    sha256: str = Field(pattern=_HEX64, description="of the whole shard (for `templar data verify`)")
    index_sha256: str = Field(pattern=_HEX64, description="of the index object")

    @model_validator(mode="after")
    def _keys(self) -> ShardInfo:
        if not _SHARD_KEY.fullmatch(self.key) or not _SHARD_KEY.fullmatch(self.index_key):
            raise ValueError(f"shard keys must look like shards/00000.tok|.idx, not {self.key!r}")
        return self


class Manifest(_Strict):
    """A prepared corpus: tokenizer identity, page geometry, shards."""

    format: Literal["templar-tokens"]
    version: Literal[1]
    name: str = Field(min_length=1, max_length=200, description="a label for logs, e.g. fineweb-edu-100b")
    tokenizer: TokenizerInfo
    dtype: Literal["uint16", "uint32"]
    sequence_length: int = Field(gt=1, le=1 << 20)
    sequences_per_page: int = Field(gt=0, le=1 << 16)
    pages_per_shard: int = Field(gt=0, le=1 << 24)
    shuffle_seed: int = Field(ge=0, description="keyed shuffle of sequences within each shard")
    documents: int = Field(ge=0)
    shards: list[ShardInfo] = Field(min_length=1, max_length=1 << 20)

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        if self.tokenizer.vocab_size > (1 << 8 * DTYPES[self.dtype]):
            raise ValueError(f"vocab {self.tokenizer.vocab_size} does not fit {self.dtype}")
        for i, shard in enumerate(self.shards):
            if shard.key != shard_key(i) or shard.index_key != index_key(i):
                raise ValueError(f"shard {i} must be {shard_key(i)} / {index_key(i)}")
            last = i == len(self.shards) - 1
            if shard.pages > self.pages_per_shard or (not last and shard.pages != self.pages_per_shard):
                raise ValueError(f"shard {i} has {shard.pages} pages; every shard but the last holds "
                                 f"exactly pages_per_shard={self.pages_per_shard}")
            if shard.bytes != shard.pages * self.page_bytes:
                raise ValueError(f"shard {i}: {shard.bytes} bytes != {shard.pages} pages x {self.page_bytes}")
        return self

    # -- geometry ------------------------------------------------------------------------------
    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype]

    @property
    def page_tokens(self) -> int:
        return self.sequence_length * self.sequences_per_page

    @property
    def page_bytes(self) -> int:
        return self.page_tokens * self.itemsize

    @property
    def num_pages(self) -> int:
        return sum(s.pages for s in self.shards)

    @property
    def num_tokens(self) -> int:
        return self.num_pages * self.page_tokens

    @property
    def total_bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    def locate(self, page: int) -> tuple[int, int]:
        """(shard index, page index within that shard) of a global page number."""
        if not isinstance(page, int) or not 0 <= page < self.num_pages:
            raise IndexError(f"page {page} outside [0, {self.num_pages})")
        return divmod(page, self.pages_per_shard)

    # -- bytes ---------------------------------------------------------------------------------
    def canonical(self) -> bytes:
        """The manifest's one byte representation: sorted keys, no whitespace, ASCII."""
        return canonical_json(self.model_dump(mode="json"))

    def digest(self) -> str:
        return hashlib.sha256(self.canonical()).hexdigest()


def shard_key(i: int) -> str:
    return f"shards/{i:05d}.tok"


def index_key(i: int) -> str:
    return f"shards/{i:05d}.idx"


def canonical_json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def parse_manifest(data: bytes, *, expected_digest: str | None = None) -> Manifest:
    """Check the bytes against the pinned digest first, then parse strictly.

    Raises `ManifestError` with one line a node can log and exit on.
    """
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"manifest is {len(data)} bytes (cap {MAX_MANIFEST_BYTES})")
    digest = hashlib.sha256(data).hexdigest()
    if expected_digest is not None and digest != expected_digest:
        raise ManifestError(f"manifest digest {digest[:16]}… does not match the pinned data.manifest "
                            f"{expected_digest[:16]}…: wrong corpus or a tampered manifest")
    try:
        raw = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ManifestError(f"manifest is not JSON: {exc}") from exc
    try:
        manifest = Manifest.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "<root>"
        raise ManifestError(f"manifest invalid at {where}: {first['msg']} ({exc.error_count()} errors)") from exc
    if manifest.canonical() != data:
        raise ManifestError("manifest is not in canonical form (sorted keys, no whitespace)")
    return manifest


def page_hash(data: bytes | memoryview) -> bytes:
    return hashlib.sha256(data).digest()


def parse_index(data: bytes, shard: ShardInfo) -> list[bytes]:
    """A shard's page hashes, after checking the index object against the manifest."""
    if len(data) != shard.pages * HASH_BYTES:
        raise ManifestError(f"{shard.index_key}: {len(data)} bytes, expected {shard.pages * HASH_BYTES}")
    if hashlib.sha256(data).hexdigest() != shard.index_sha256:
        raise ManifestError(f"{shard.index_key}: sha256 does not match the manifest")
    return [data[i:i + HASH_BYTES] for i in range(0, len(data), HASH_BYTES)]
