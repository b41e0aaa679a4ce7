"""`templar data prepare`: text in, token shards and a manifest out, the same on every machine.

    templar data prepare assets/corpus --tokenizer assets/tokenizer --out assets/shards \
        --sequence-length 128 --sequences-per-page 4
    templar data prepare hub:HuggingFaceFW/fineweb-edu:sample-100BT --tokenizer hub:... \
        --out r2:<locator> --work /scratch/prep

Documents are read in a fixed order (files sorted by path; a hub dataset in its streaming order),
tokenized in worker processes (`Pool.imap` keeps the order whatever the worker count), joined
with EOS and cut into shards of `pages_per_shard` whole pages. Within a shard the sequences are
permuted by a keyed Feistel network, so every page samples its shard's span of documents (a
page of one play or one run of encyclopaedia articles would make LossScores of different pages
incomparable); the tail shorter than one page is dropped. Same input + tokenizer + geometry ⇒
same bytes ⇒ same manifest digest.

Resumable: after each shard the writer records (documents consumed, tokens carried over) in
`prepare-state.json` in the work folder; a rerun with the same settings skips what is done.
A bucket destination (`upload`) gets the shards not already there (same size = done) and the
manifest last, so a reader never sees a manifest that names missing shards.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from loguru import logger

from templar.data.manifest import (
    HASH_BYTES,
    MANIFEST_KEY,
    VERSION,
    Manifest,
    ShardInfo,
    TokenizerInfo,
    canonical_json,
    index_key,
    page_hash,
    shard_key,
)
from templar.data.plan import feistel, round_key
from templar.storage import Bucket, ObjectNotFound

STATE_FILE = "prepare-state.json"
SUFFIXES = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
DOCS_PER_TASK = 256


class PrepareError(ValueError):
    """The source or settings cannot produce a corpus (the message says what to change)."""


@dataclass(frozen=True)
class Geometry:
    """How tokens are cut: sequences, pages, shards."""

    sequence_length: int
    sequences_per_page: int
    pages_per_shard: int
    shuffle_seed: int = 0

    @property
    def page_tokens(self) -> int:
        return self.sequence_length * self.sequences_per_page

    @property
    def shard_tokens(self) -> int:
        return self.page_tokens * self.pages_per_shard


# ----------------------------------------------------------------------------------- sources
def local_files(path: Path) -> list[Path]:
    """Text/jsonl/parquet files under `path` (sorted, hidden names skipped), all of one kind."""
    if path.is_file():
        files = [path]
    else:
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
    if not files:
        raise PrepareError(f"no .txt/.jsonl/.parquet files under {path}")
    kinds = {SUFFIXES.get(p.suffix) for p in files}
    if len(kinds) != 1 or None in kinds:
        raise PrepareError(f"{path}: mixed or unknown file kinds {sorted(p.suffix for p in files)}; "
                           "keep one format per corpus")
    return files


def documents(source: str, text_field: str) -> Iterator[str]:
    """Every non-empty document of `source`, in a fixed order.

    `hub:<repo>[:<config>]` streams a Hugging Face dataset (online machines only); anything else
    is a local file or folder: `.txt` (one document per line), `.jsonl` (one object per line,
    `text_field`), `.parquet` (`text_field` column).
    """
    if source.startswith("hub:"):
        from datasets import load_dataset

        repo, _, config = source[4:].partition(":")
        stream = load_dataset(repo, config or None, split="train", streaming=True)
        for row in stream:
            text = row.get(text_field)
            if isinstance(text, str) and text:
                yield text
        return
    for path in local_files(Path(source)):
        kind = SUFFIXES[path.suffix]
        if kind == "parquet":
            import pyarrow.parquet as pq

            for batch in pq.ParquetFile(path).iter_batches(columns=[text_field], batch_size=1024):
                for text in batch.column(0).to_pylist():
                    if isinstance(text, str) and text:
                        yield text
            continue
        with path.open(encoding="utf-8") as fh:
            for line in fh:
                if kind == "text":
                    text = line.rstrip("\n")
                else:
                    if not line.strip():
                        continue
                    text = json.loads(line).get(text_field)
                if isinstance(text, str) and text:
                    yield text


def source_fingerprint(source: str) -> str:
    """Identity of the input for resumption: hub name, or file names, sizes and mtimes."""
    if source.startswith("hub:"):
        return source
    h = hashlib.sha256()
    root = Path(source)
    for p in local_files(root):
        st = p.stat()
        h.update(f"{p.name}|{st.st_size}|{int(st.st_mtime)}".encode())
    return h.hexdigest()


# --------------------------------------------------------------------------------- tokenizer
def load_tokenizer(name: str) -> Any:
    """A local tokenizer directory (offline) or `hub:<repo>` (online machines)."""
    from transformers import AutoTokenizer

    if name.startswith("hub:"):
        return AutoTokenizer.from_pretrained(name[4:])
    return AutoTokenizer.from_pretrained(str(name), local_files_only=True)


def tokenizer_info(tokenizer: Any, name: str) -> TokenizerInfo:
    """Name, digest (canonical JSON of the whole fast-tokenizer definition), vocab and EOS."""
    if tokenizer.eos_token_id is None:
        raise PrepareError(f"tokenizer {name} has no EOS token")
    definition = json.loads(tokenizer.backend_tokenizer.to_str())
    digest = hashlib.sha256(canonical_json(definition)).hexdigest()
    label = name if name.startswith("hub:") else Path(name).name
    return TokenizerInfo(name=label, sha256=digest, vocab_size=len(tokenizer), eos_id=int(tokenizer.eos_token_id))


_worker_tokenizer: Any = None
_worker_dtype: Any = None


def _init_worker(name: str, dtype: str) -> None:
    global _worker_tokenizer, _worker_dtype
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _worker_tokenizer = load_tokenizer(name)
    _worker_dtype = np.dtype(dtype).newbyteorder("<")


def _tokenize(docs: list[str]) -> np.ndarray:
    eos = _worker_tokenizer.eos_token_id
    ids = _worker_tokenizer(docs, add_special_tokens=False)["input_ids"]
    return np.fromiter((t for doc in ids for t in (*doc, eos)), dtype=_worker_dtype)


def _chunks(docs: Iterator[str], skip: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for i, doc in enumerate(docs):
        if i < skip:
            continue
        chunk.append(doc)
        if len(chunk) == DOCS_PER_TASK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


# ------------------------------------------------------------------------------------ shards
def shuffle_sequences(tokens: np.ndarray, sequence_length: int, seed: int, shard: int) -> np.ndarray:
    """Sequences of one shard in keyed-permuted order (stable across numpy versions)."""
    rows = tokens.reshape(-1, sequence_length)
    key = round_key(seed, "shard", shard)
    order = np.fromiter((feistel(j, len(rows), key) for j in range(len(rows))), dtype=np.int64, count=len(rows))
    return np.ascontiguousarray(rows[order]).reshape(-1)


def write_shard(out: Path, index: int, tokens: np.ndarray, geometry: Geometry, *, shuffle: bool = True) -> ShardInfo:
    """Write `shards/NNNNN.tok` and its page index atomically; return its manifest entry."""
    tokens = tokens.astype(tokens.dtype.newbyteorder("<"), copy=False)
    data = (shuffle_sequences(tokens, geometry.sequence_length, geometry.shuffle_seed, index) if shuffle
            else tokens).tobytes()
    page_bytes = geometry.page_tokens * tokens.itemsize
    pages = len(data) // page_bytes
    index_bytes = b"".join(page_hash(memoryview(data)[p * page_bytes:(p + 1) * page_bytes]) for p in range(pages))
    assert len(index_bytes) == pages * HASH_BYTES
    for key, body in ((shard_key(index), data), (index_key(index), index_bytes)):
        path = out / key
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(body)
        os.replace(tmp, path)
    return ShardInfo(key=shard_key(index), index_key=index_key(index), pages=pages, bytes=len(data),
                     sha256=hashlib.sha256(data).hexdigest(), index_sha256=hashlib.sha256(index_bytes).hexdigest())


def write_manifest(out: Path, manifest: Manifest) -> None:
    tmp = out / f".{MANIFEST_KEY}.tmp"
    tmp.write_bytes(manifest.canonical())
    os.replace(tmp, out / MANIFEST_KEY)


def write_token_corpus(out: Path, shards: Iterable[np.ndarray], geometry: Geometry, *, name: str,
                       tokenizer: TokenizerInfo, shuffle: bool = True) -> Manifest:
    """A corpus from token arrays given shard by shard (synthetic corpora: tests, benchmarks).

    Each array must hold `pages_per_shard` whole pages (the last may hold fewer).
    """
    infos = [write_shard(out, i, tokens, geometry, shuffle=shuffle) for i, tokens in enumerate(shards)]
    dtype = "uint16" if tokenizer.vocab_size <= 1 << 16 else "uint32"
    manifest = Manifest(format="templar-tokens", version=VERSION, name=name, tokenizer=tokenizer, dtype=dtype,
                        sequence_length=geometry.sequence_length, sequences_per_page=geometry.sequences_per_page,
                        pages_per_shard=geometry.pages_per_shard, shuffle_seed=geometry.shuffle_seed,
                        documents=0, shards=infos)
    write_manifest(out, manifest)
    return manifest


@dataclass
class _State:
    """Progress recorded after every shard, enough to resume exactly."""

    settings: str
    documents: int
    shards: list[dict[str, Any]]
    carry_tokens: int
    done: bool = False

    def save(self, work: Path) -> None:
        tmp = work / f".{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(self.__dict__))
        os.replace(tmp, work / STATE_FILE)

    @classmethod
    def load(cls, work: Path, settings: str) -> _State:
        path = work / STATE_FILE
        if path.exists():
            raw = json.loads(path.read_text())
            if raw.get("settings") == settings:
                return cls(**raw)
            logger.warning(f"{path}: written for other settings; starting over")
        return cls(settings=settings, documents=0, shards=[], carry_tokens=0)


def prepare(source: str, tokenizer_name: str, work: Path, geometry: Geometry, *, name: str,
            text_field: str = "text", workers: int | None = None, progress: bool = True,
            on_shard: Any = None, max_tokens: int | None = None) -> Manifest:
    """Tokenize `source` into shards under `work`; write and return the manifest.

    `max_tokens`: stop reading the source once this many tokens are cut (whole pages of them):
    a streamed hub dataset of 100B tokens need not be read to its end for a run that uses less.

    `workers`: tokenizer processes (default: all cores but one, or none below three cores; 0 tokenizes
    in this process).

    `on_shard(work, ShardInfo)` runs after each shard is final (the bucket upload hook).
    """
    work.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(tokenizer_name)
    tok = tokenizer_info(tokenizer, tokenizer_name)
    dtype = "uint16" if tok.vocab_size <= 1 << 16 else "uint32"
    settings = hashlib.sha256(canonical_json({
        "source": source_fingerprint(source), "tokenizer": tok.sha256, "geometry": geometry.__dict__,
        "text_field": text_field, "name": name, "version": VERSION,
        **({"max_tokens": max_tokens} if max_tokens else {})})).hexdigest()
    state = _State.load(work, settings)
    if state.done and (work / MANIFEST_KEY).is_file():
        manifest = Manifest.model_validate_json((work / MANIFEST_KEY).read_bytes())
        logger.info(f"{work}: already prepared with these settings (digest {manifest.digest()})")
        return manifest
    carry_path = work / ".carry.npy"
    carry = np.load(carry_path) if state.carry_tokens else np.zeros(0, dtype=dtype)
    if len(carry) != state.carry_tokens:
        raise PrepareError(f"{carry_path} does not match {STATE_FILE}; delete the work folder and start over")
    shards = [ShardInfo.model_validate(s) for s in state.shards]
    if shards:
        logger.info(f"resuming after {len(shards)} shards and {state.documents} documents")
    buffer: list[np.ndarray] = [carry]
    buffered = len(carry)
    docs_done = state.documents
    if workers is None:
        # All cores but one; on a machine with two cores or fewer that is one worker process, which
        # tokenizes no faster than this process and costs its start-up (6 s of 7 s for a 1M-token corpus).
        workers = (os.cpu_count() or 1) - 1
        workers = workers if workers >= 2 else 0
    bar = _progress(progress, docs_done)

    def flush(final: bool) -> None:
        nonlocal buffer, buffered
        tokens = np.concatenate(buffer) if buffer else np.zeros(0, dtype=dtype)
        while len(tokens) >= geometry.shard_tokens or (final and len(tokens) >= geometry.page_tokens):
            take = min(len(tokens), geometry.shard_tokens) // geometry.page_tokens * geometry.page_tokens
            info = write_shard(work, len(shards), tokens[:take], geometry)
            shards.append(info)
            tokens = tokens[take:]
            if not final:
                np.save(carry_path, tokens)
                _State(settings, docs_done, [s.model_dump() for s in shards], len(tokens)).save(work)
            if on_shard is not None:
                on_shard(work, info)
        buffer, buffered = [tokens], len(tokens)

    counts: list[int] = []

    def feed() -> Iterator[list[str]]:
        for chunk in _chunks(documents(source, text_field), state.documents):
            counts.append(len(chunk))
            yield chunk

    with contextlib.ExitStack() as stack:
        if workers > 0:
            pool = stack.enter_context(multiprocessing.get_context("spawn").Pool(
                workers, initializer=_init_worker, initargs=(tokenizer_name, dtype)))
            results = pool.imap(_tokenize, feed(), chunksize=1)
        else:  # in-process (tests, tiny corpora): no worker start-up cost
            _init_worker(tokenizer_name, dtype)
            results = map(_tokenize, feed())
        for i, tokens in enumerate(results):
            docs_done += counts[i]
            if max_tokens:
                room = max_tokens - sum(s.pages for s in shards) * geometry.page_tokens - buffered
                tokens = tokens[:max(0, room)]
            buffer.append(tokens)
            buffered += len(tokens)
            bar(counts[i], len(tokens))
            if buffered >= geometry.shard_tokens:
                flush(final=False)
            if max_tokens and sum(s.pages for s in shards) * geometry.page_tokens + buffered >= max_tokens:
                break
    flush(final=True)
    bar(0, 0, close=True)
    if not shards:
        raise PrepareError(f"{source}: fewer tokens than one page ({geometry.page_tokens})")
    manifest = Manifest(format="templar-tokens", version=VERSION, name=name, tokenizer=tok, dtype=dtype,
                        sequence_length=geometry.sequence_length, sequences_per_page=geometry.sequences_per_page,
                        pages_per_shard=geometry.pages_per_shard, shuffle_seed=geometry.shuffle_seed,
                        documents=docs_done, shards=shards)
    write_manifest(work, manifest)
    _State(settings, docs_done, [], 0, done=True).save(work)  # a rerun returns at once
    carry_path.unlink(missing_ok=True)
    logger.info(f"prepared {manifest.name}: {manifest.num_tokens:,} tokens in {manifest.num_pages:,} pages, "
                f"{len(shards)} shards, digest {manifest.digest()}")
    return manifest


def _progress(enabled: bool, start: int) -> Any:
    """A callback `(documents, tokens, close=False)` that drives a rich progress bar."""
    if not enabled:
        return lambda *_, **__: None
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), transient=False)
    task = bar.add_task("", total=None)
    bar.start()
    totals = {"docs": start, "tokens": 0}

    def update(docs: int, tokens: int, close: bool = False) -> None:
        totals["docs"] += docs
        totals["tokens"] += tokens
        bar.update(task, description=f"{totals['docs']:,} documents, {totals['tokens']:,} tokens")
        if close:
            bar.stop()

    return update


async def upload(work: Path, bucket: Bucket, prefix: str, manifest: Manifest, *, timeout: float | None = None) -> None:
    """Shards and indexes not yet in the bucket (same size = done), then the manifest last."""
    for shard in manifest.shards:
        for key in (shard.key, shard.index_key):
            remote = prefix + key
            size = (work / key).stat().st_size
            try:
                if (await bucket.head(remote, timeout=30)).size == size:
                    continue
            except ObjectNotFound:
                pass
            await bucket.put_file(remote, work / key, timeout=timeout)
    await bucket.put(prefix + MANIFEST_KEY, manifest.canonical(), timeout=60)
    logger.info(f"uploaded {len(manifest.shards)} shards and the manifest to {bucket.name}/{prefix}")
