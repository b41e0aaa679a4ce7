"""Pages on demand from a local SeaweedFS server, against today's whole-corpus path.

    python -m benchmarks.performance.data            # 10M, 100M and 1B-token corpora; baseline on 10M
    python -m benchmarks.performance.data --quick    # 10M and 50M tokens; baseline on 10M

Synthetic corpora in the production geometry (2048-token sequences, 64 per page: 256 KiB pages;
1024 pages = 128M tokens per shard) are written directly with numpy (no tokenizer), uploaded to
a SeaweedFS bucket on 127.0.0.1, and deleted locally. Each measurement runs in a fresh process,
so its peak RSS is its own:

  on demand   load the pinned manifest, then fetch: time to first page; a cold batch of 64
              pages in batches of 8 (pages/s); the same pages again from the on-disk cache (pages/s); a miner's
              window (3 pages) with the next window's 3 prefetched, and whether those were all
              local before the next window asked for them; peak RSS over the process's RSS
              after imports.
  baseline    (smallest size) what a node did before: download every shard of the corpus as
              parquet text, tokenize all of it, then read page 0 (`old_whole_corpus`); and, for
              reference, downloading every token shard of the new format before the first page
              (`download_all_shards`).

Client and server share this machine's cores; the figures are loopback, not a network.
Results: one JSON line per case on stdout and benchmarks/results/data.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks._common import emit, write_result

SEQ, SPP, PAGES_PER_SHARD = 2048, 64, 1024
PAGE_TOKENS = SEQ * SPP
COLD_PAGES = 64
BATCH_PAGES = 8
WINDOW_PAGES = 3


def _status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _rss_mb() -> float:
    return _status_mb("VmRSS")


def _peak_mb() -> float:
    """This process's own high-water RSS. Not `getrusage().ru_maxrss`: Linux carries the parent's
    high-water mark across fork+exec into it, so a child would report the driver's peak."""
    return _status_mb("VmHWM")


# ------------------------------------------------------------------------------ corpus making
def make_corpus(out: Path, tokens: int, seed: int = 0):
    """Random uint16 tokens, shard by shard (never the whole corpus in memory)."""
    from templar.data.manifest import TokenizerInfo
    from templar.data.prepare import Geometry, write_token_corpus

    geometry = Geometry(SEQ, SPP, PAGES_PER_SHARD)
    pages = tokens // PAGE_TOKENS
    rng = np.random.default_rng(seed)

    def shards():
        for first in range(0, pages, PAGES_PER_SHARD):
            n = min(PAGES_PER_SHARD, pages - first)
            yield rng.integers(0, 32000, size=n * PAGE_TOKENS, dtype=np.uint16)

    info = TokenizerInfo(name="synthetic", sha256="0" * 64, vocab_size=32000, eos_id=2)
    return write_token_corpus(out, shards(), geometry, name=f"synthetic-{tokens}", tokenizer=info, shuffle=False)


def make_text_corpus(out: Path, tokens: int, tokenizer: Path) -> int:
    """Parquet text shards of about `tokens` tokens (the sample corpus repeated); returns documents."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from templar.data.prepare import documents

    sample = list(documents(str(tokenizer.parent / "corpus"), "text"))
    per_copy = 2_893_312  # tokens of one copy of the sample corpus (tiny preset manifest)
    copies = max(1, round(tokens / per_copy))
    out.mkdir(parents=True, exist_ok=True)
    for c in range(copies):
        pq.write_table(pa.table({"text": sample}), out / f"part-{c:03d}.parquet")
    return copies * len(sample)


async def _upload_dir(server, bucket_name: str, local: Path, prefix: str) -> None:
    from templar.storage import S3Bucket

    async with S3Bucket(server.endpoint_url, bucket_name, server.admin) as b:
        for path in sorted(p for p in local.rglob("*") if p.is_file() and not p.name.startswith(".")):
            await b.put_file(prefix + path.relative_to(local).as_posix(), path)


# ------------------------------------------------------------------------------- measurements
async def measure_on_demand(cfg: dict) -> dict:
    from templar.data import PageReader, load_manifest
    from templar.storage import S3Bucket

    rss0 = _rss_mb()
    cache = Path(cfg["cache"])
    creds = _creds(cfg)
    async with S3Bucket(cfg["endpoint"], cfg["bucket"], creds) as bucket:
        started = time.perf_counter()
        manifest = await load_manifest(bucket, "", cfg["digest"], cache)
        reader = PageReader(manifest, bucket, "", cache, cache_bytes=1 << 30)
        rng = np.random.default_rng(1)
        order = [int(p) for p in rng.permutation(manifest.num_pages)]
        batch, got = await reader.fetch(order[:1])
        first_page = time.perf_counter() - started
        assert got == order[:1] and batch.shape == (SPP, SEQ)

        cold = order[1:1 + COLD_PAGES]
        del batch

        async def read_all() -> float:
            # In batches of a window's size (a node never holds more), each dropped before the next.
            t = time.perf_counter()
            for i in range(0, len(cold), BATCH_PAGES):
                _, got = await reader.fetch(cold[i:i + BATCH_PAGES])
                assert got == cold[i:i + BATCH_PAGES]
            return time.perf_counter() - t

        cold_s = await read_all()
        cached_s = await read_all()

        window = order[1 + COLD_PAGES:1 + COLD_PAGES + WINDOW_PAGES]
        nxt = order[1 + COLD_PAGES + WINDOW_PAGES:1 + COLD_PAGES + 2 * WINDOW_PAGES]
        t = time.perf_counter()
        await reader.fetch(window, prefetch=nxt)
        window_s = time.perf_counter() - t
        t = time.perf_counter()
        await reader.wait_prefetched()
        prefetch_s = time.perf_counter() - t
        remote = reader.stats["remote"]
        t = time.perf_counter()
        _, got = await reader.fetch(nxt)
        next_window_s = time.perf_counter() - t
        ready = reader.stats["remote"] == remote and got == nxt
        await reader.aclose()
    return {"first_page_seconds": first_page, "cold_pages_per_second": len(cold) / cold_s,
            "cached_pages_per_second": len(cold) / cached_s, "window_fetch_seconds": window_s,
            "prefetch_remaining_seconds": prefetch_s, "next_window_fetch_seconds": next_window_s,
            "next_window_ready_before_training": ready, "manifest_bytes": len(manifest.canonical()),
            "rss_after_imports_mb": rss0, "peak_rss_mb": _peak_mb(), "rss_growth_mb": _peak_mb() - rss0}


async def measure_download_all(cfg: dict) -> dict:
    """Reference: every token shard downloaded before the first page (memory-mapped after)."""
    from templar.data import LocalCorpus
    from templar.storage import S3Bucket

    rss0 = _rss_mb()
    dest = Path(cfg["cache"])
    async with S3Bucket(cfg["endpoint"], cfg["bucket"], _creds(cfg)) as bucket:
        started = time.perf_counter()
        for obj in await bucket.list(""):
            await bucket.get_file(obj.key, dest / obj.key, max_bytes=obj.size)
        corpus = LocalCorpus(dest, digest=cfg["digest"])
        corpus.page(0)
        first_page = time.perf_counter() - started
    return {"first_page_seconds": first_page, "rss_after_imports_mb": rss0, "peak_rss_mb": _peak_mb(),
            "rss_growth_mb": _peak_mb() - rss0}


async def measure_old_path(cfg: dict) -> dict:
    """Today's path before this change: download every parquet shard, tokenize all, page 0."""
    from templar.data.prepare import documents, load_tokenizer
    from templar.storage import S3Bucket

    rss0 = _rss_mb()
    dest = Path(cfg["cache"])
    async with S3Bucket(cfg["endpoint"], cfg["bucket"], _creds(cfg)) as bucket:
        started = time.perf_counter()
        for obj in await bucket.list(""):
            await bucket.get_file(obj.key, dest / obj.key, max_bytes=obj.size)
        downloaded = time.perf_counter() - started
        tok = load_tokenizer(cfg["tokenizer"])
        eos = tok.eos_token_id
        parts, batch = [], []
        for doc in documents(str(dest), "text"):
            batch.append(doc)
            if len(batch) == 1024:
                parts.extend(np.asarray([*ids, eos], dtype=np.uint16)
                             for ids in tok(batch, add_special_tokens=False)["input_ids"])
                batch.clear()
        if batch:
            parts.extend(np.asarray([*ids, eos], dtype=np.uint16) for ids in tok(batch, add_special_tokens=False)["input_ids"])
        tokens = np.concatenate(parts)
        page0 = tokens[:PAGE_TOKENS].astype(np.int64)
        first_page = time.perf_counter() - started
    assert len(page0) == PAGE_TOKENS
    return {"first_page_seconds": first_page, "download_seconds": downloaded, "tokens": len(tokens),
            "rss_after_imports_mb": rss0, "peak_rss_mb": _peak_mb(), "rss_growth_mb": _peak_mb() - rss0}


def _creds(cfg: dict):
    from templar.storage.locator import Credentials

    return Credentials(cfg["key_id"], cfg["secret"])


MEASURES = {"on_demand": measure_on_demand, "download_all": measure_download_all, "old_path": measure_old_path}


def run_child(kind: str, cfg: dict) -> dict:
    """One measurement in a fresh interpreter (its own peak RSS), this module run from the repository
    root; the config travels on stdin."""
    from templar.core.config import REPO_ROOT

    proc = subprocess.run([sys.executable, "-m", __spec__.name, "--child", kind], input=json.dumps(cfg), text=True,
                          cwd=REPO_ROOT, capture_output=True, timeout=3600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode:
        raise RuntimeError(f"{kind} failed: {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------- driver
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10M and 50M tokens")
    parser.add_argument("--sizes", type=float, nargs="*", default=None, help="corpus sizes in tokens")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import torch  # noqa: F401 - a node has torch loaded: count it in the baseline RSS

        print(json.dumps(asyncio.run(MEASURES[args.child](json.loads(sys.stdin.read())))))
        return

    from templar.core.config import REPO_ROOT
    from templar.storage.seaweed import SeaweedServer

    sizes = [int(s) for s in (args.sizes or ([1e7, 5e7] if args.quick else [1e7, 1e8, 1e9]))]
    tokenizer = REPO_ROOT / "assets" / "tokenizer"
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp_dir:
        tmp = Path(tmp_dir)
        server = SeaweedServer(tmp / "seaweed", memory_limit="512MiB")
        server.start()
        try:
            base = {"endpoint": server.endpoint_url, "key_id": server.reader.access_key_id,
                    "secret": server.reader.secret_access_key}
            for tokens in sizes:
                name = f"corpus-{tokens}"
                t = time.perf_counter()
                manifest = make_corpus(tmp / name, tokens)
                made = time.perf_counter() - t
                server.create_bucket(name)
                t = time.perf_counter()
                asyncio.run(_upload_dir(server, name, tmp / name, ""))
                uploaded = time.perf_counter() - t
                shutil.rmtree(tmp / name)
                cfg = {**base, "bucket": name, "digest": manifest.digest(), "cache": str(tmp / f"cache-{tokens}")}
                record = {"case": "on_demand", "tokens": manifest.num_tokens, "pages": manifest.num_pages,
                          "shards": len(manifest.shards), "generate_seconds": made, "upload_seconds": uploaded,
                          **run_child("on_demand", cfg)}
                emit(record)
                results[f"on_demand_{tokens}"] = record
                shutil.rmtree(tmp / f"cache-{tokens}", ignore_errors=True)
                if tokens == sizes[0]:
                    cfg["cache"] = str(tmp / "download-all")
                    record = {"case": "download_all_shards", "tokens": manifest.num_tokens,
                              **run_child("download_all", cfg)}
                    emit(record)
                    results[f"download_all_{tokens}"] = record
                    shutil.rmtree(tmp / "download-all", ignore_errors=True)

            smallest = sizes[0]
            docs = make_text_corpus(tmp / "text", smallest, tokenizer)
            server.create_bucket("text")
            asyncio.run(_upload_dir(server, "text", tmp / "text", ""))
            cfg = {**base, "bucket": "text", "cache": str(tmp / "old"), "tokenizer": str(tokenizer)}
            record = {"case": "old_whole_corpus", "documents": docs, **run_child("old_path", cfg)}
            emit(record)
            results[f"old_whole_corpus_{smallest}"] = record
        finally:
            server.stop(kill=True)

    small, large = results[f"on_demand_{sizes[0]}"], results[f"on_demand_{sizes[-1]}"]
    old = results[f"old_whole_corpus_{sizes[0]}"]
    summary = {
        "first_page_ratio_largest_vs_smallest": large["first_page_seconds"] / small["first_page_seconds"],
        "rss_growth_smallest_to_largest_mb": large["peak_rss_mb"] - small["peak_rss_mb"],
        "first_page_speedup_vs_old_path": old["first_page_seconds"] / small["first_page_seconds"],
        "peak_rss_saving_vs_old_path_mb": old["peak_rss_mb"] - small["peak_rss_mb"],
        "next_window_ready_before_training": all(r.get("next_window_ready_before_training", True)
                                                 for r in results.values()),
        "targets": {"first_page_ratio_max": 2.0, "rss_growth_max_mb": 50.0},
    }
    emit({"case": "summary", **summary})
    if not args.quick and args.sizes is None:
        path = write_result("data.json", {"sizes": sizes, "geometry": {"sequence_length": SEQ,
                            "sequences_per_page": SPP, "pages_per_shard": PAGES_PER_SHARD},
                            "results": results, "summary": summary})
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
