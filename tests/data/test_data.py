"""Deterministic page assignment, the corpus format and `prepare` (offline, no bucket)."""

import json
from pathlib import Path

import numpy as np
import pytest

from templar.data import (
    MAX_UIDS,
    LocalCorpus,
    ManifestError,
    PageError,
    PagePlan,
    assigned_pages,
    parse_manifest,
    random_pages,
)
from templar.data.manifest import MANIFEST_KEY
from templar.data.prepare import STATE_FILE, Geometry, PrepareError, load_tokenizer, prepare

NUM_PAGES = 5651  # the tiny preset over the sample corpus


def test_assignment_is_a_pure_function_with_stable_values():
    # Golden values: a change here means every node's data assignment changed (a consensus break).
    assert assigned_pages(1337, 0, 5, 2, NUM_PAGES, 0.02) == [2247, 45]
    assert assigned_pages(1337, 1, 5, 2, NUM_PAGES, 0.02) == [3025, 3874]
    assert assigned_pages(1337, 0, 5, 2, NUM_PAGES, 0.02) == assigned_pages(1337, 0, 5, 2, NUM_PAGES, 0.02)
    assert assigned_pages(1337, 0, 6, 2, NUM_PAGES, 0.02) != assigned_pages(1337, 0, 5, 2, NUM_PAGES, 0.02)
    assert assigned_pages(7, 0, 5, 2, NUM_PAGES, 0.02) != assigned_pages(1337, 0, 5, 2, NUM_PAGES, 0.02)


def test_uids_get_disjoint_pages_and_never_holdout():
    plan = PagePlan.build(NUM_PAGES, 0.02, 1337, 2)
    holdout = set(plan.holdout_pages())
    assert len(holdout) == int(NUM_PAGES * 0.02)
    for window in (0, 1, 99):
        pages = [p for uid in range(MAX_UIDS) for p in plan.assigned_pages(uid, window, 2)]
        assert len(pages) == len(set(pages)) == 2 * MAX_UIDS
        assert not holdout & set(pages)
        assert all(0 <= p < NUM_PAGES for p in pages)
        rand = plan.random_pages(window, 8)
        assert len(set(rand)) == 8 and not set(rand) & (set(pages) | holdout)
        assert plan.random_pages(window, 8, salt=1) != rand
        for salt in (7, 10**6, 2**61 - 1):  # validators use a private 64-bit salt: never an assigned page
            assert not set(plan.random_pages(window, 8, salt=salt % plan.pool)) & (set(pages) | holdout)
        assert not set(plan.random_pages(window, 4, exclude=rand[:2])) & set(rand[:2])


def test_declared_pages_are_public_disjoint_and_never_random():
    """A miner's declared extra pages (`--extra-pages`) follow from (seed, uid, window, count): the
    first `count` of its declared slot, apart from every uid's assigned and declared pages, and never
    a validator's random pages. Assignment itself is unchanged by the declared slots."""
    plan = PagePlan.build(NUM_PAGES, 0.02, 1337, 2, declared_per_uid=2)
    assert plan.assigned_pages(0, 5, 2) == PagePlan.build(NUM_PAGES, 0.02, 1337, 2).assigned_pages(0, 5, 2)
    holdout = set(plan.holdout_pages())
    for window in (0, 99):
        assigned = {p for uid in range(MAX_UIDS) for p in plan.assigned_pages(uid, window, 2)}
        declared = [p for uid in range(MAX_UIDS) for p in plan.declared_pages(uid, window, 2)]
        assert len(declared) == len(set(declared)) == 2 * MAX_UIDS
        assert not set(declared) & (assigned | holdout)
        assert plan.declared_pages(7, window, 1) == plan.declared_pages(7, window, 2)[:1]  # a prefix: no choice
        assert plan.declared_pages(7, window, 0) == []
        for salt in (0, 7, 10**6 % plan.pool):
            assert not set(plan.random_pages(window, 8, salt=salt)) & (set(declared) | assigned | holdout)
    for n in (-1, 3):
        with pytest.raises(ValueError, match="extra pages"):
            plan.declared_pages(0, 0, n)
    small = PagePlan.build(1200, 0.0, 1, 2, declared_per_uid=2)  # too small for the declared slots:
    assigned = {p for uid in range(MAX_UIDS) for p in small.assigned_pages(uid, 3, 2)}
    assert not set(small.random_pages(3, 8)) & assigned  # random pages still avoid every assignment


def test_random_pages_function_form():
    pages = random_pages(1337, 3, 4, NUM_PAGES, pages_per_uid=2, holdout_fraction=0.02)
    assert pages == random_pages(1337, 3, 4, NUM_PAGES, pages_per_uid=2, holdout_fraction=0.02)
    assert len(set(pages)) == 4


def test_uid_out_of_range_is_refused():
    with pytest.raises(ValueError):
        PagePlan.build(NUM_PAGES, 0.0, 1, 2).assigned_pages(MAX_UIDS, 0, 2)


def test_pages_have_the_preset_shape(tiny_pages: LocalCorpus):
    assert tiny_pages.num_pages == NUM_PAGES  # same token stream as the old whole-corpus path
    page = tiny_pages.page(123)
    assert page.shape == (4, 128) and page.dtype.is_floating_point is False
    assert tiny_pages.batch([1, 2]).shape == (8, 128)
    assert tiny_pages.batch([]).shape == (0, 128)
    with pytest.raises(IndexError):
        tiny_pages.page(NUM_PAGES)


def _docs(n: int = 60) -> list[str]:
    return [f"Document number {i} is about windows, buckets and gradients. " * (5 + i % 7) for i in range(n)]


def _write_corpus(root: Path, kind: str, docs: list[str], field: str = "text") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    if kind == "txt":
        (root / "a.txt").write_text("\n".join(docs))
    elif kind == "jsonl":
        (root / "a.jsonl").write_text("\n".join(json.dumps({field: d}) for d in docs[:30]))
        (root / "b.jsonl").write_text("\n".join(json.dumps({field: d}) for d in docs[30:]))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({field: docs}), root / "a.parquet")
    return root


GEOMETRY = Geometry(sequence_length=32, sequences_per_page=2, pages_per_shard=8)


@pytest.mark.parametrize("kind", ["txt", "jsonl", "parquet"])
def test_prepare_local_sources(tmp_path, assets_dir, kind):
    docs = _docs()
    src = _write_corpus(tmp_path / "src", kind, docs, field="body")
    out = tmp_path / "out"
    m = prepare(str(src), str(assets_dir / "tokenizer"), out, GEOMETRY, name="t", text_field="body",
                workers=0, progress=False)
    tok = load_tokenizer(str(assets_dir / "tokenizer"))
    expected = sum(len(tok(d, add_special_tokens=False)["input_ids"]) + 1 for d in docs)
    assert m.documents == len(docs) and m.dtype == "uint16"
    assert m.num_tokens == expected // m.page_tokens * m.page_tokens  # only the tail shorter than a page is dropped
    assert len(m.shards) == -(-m.num_pages // 8) and all(s.pages == 8 for s in m.shards[:-1])
    corpus = LocalCorpus(out, digest=m.digest())
    tokens = np.concatenate([corpus.page(i).numpy().ravel() for i in range(corpus.num_pages)])
    assert int(np.sum(tokens == tok.eos_token_id)) > 0 and tokens.max() < len(tok)
    # the in-shard shuffle keeps every token: the multiset of each shard equals the unshuffled stream's
    stream = np.concatenate([np.asarray([*tok(d, add_special_tokens=False)["input_ids"], tok.eos_token_id])
                             for d in docs])[:m.num_tokens]
    assert np.array_equal(np.sort(tokens), np.sort(stream))
    assert json.loads((out / STATE_FILE).read_text())["done"]
    again = prepare(str(src), str(assets_dir / "tokenizer"), out, GEOMETRY, name="t", text_field="body",
                    workers=0, progress=False, on_shard=lambda *_: pytest.fail("a finished corpus was redone"))
    assert again.digest() == m.digest()


@pytest.mark.slow(seconds=5)
def test_prepare_is_deterministic_and_resumable(tmp_path, assets_dir, monkeypatch):
    import templar.data.prepare as prep

    monkeypatch.setattr(prep, "DOCS_PER_TASK", 16)  # many tasks, so a resume skips documents
    src = _write_corpus(tmp_path / "src", "jsonl", _docs(200))
    tokenizer = str(assets_dir / "tokenizer")
    one = prepare(str(src), tokenizer, tmp_path / "a", GEOMETRY, name="t", workers=0, progress=False)
    two = prepare(str(src), tokenizer, tmp_path / "b", GEOMETRY, name="t", workers=1, progress=False)
    assert one.digest() == two.digest() and len(one.shards) > 3
    assert (tmp_path / "a" / MANIFEST_KEY).read_bytes() == one.canonical()

    # An interrupted run: the state after shard 2 and the shards written so far; the rest is redone.
    work = tmp_path / "c"
    calls = []

    def stop_after_two(_work, info):
        calls.append(info.key)
        if len(calls) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        prepare(str(src), tokenizer, work, GEOMETRY, name="t", workers=0, progress=False, on_shard=stop_after_two)
    assert (work / STATE_FILE).exists() and not (work / MANIFEST_KEY).exists()
    assert 0 < json.loads((work / STATE_FILE).read_text())["documents"] < 200
    resumed = []
    again = prepare(str(src), tokenizer, work, GEOMETRY, name="t", workers=0, progress=False,
                    on_shard=lambda _w, info: resumed.append(info.key))
    assert again.digest() == one.digest()
    assert resumed[0] == "shards/00002.tok"  # shards 0 and 1 were not redone

    other = prepare(str(src), tokenizer, tmp_path / "d", Geometry(32, 2, 8, shuffle_seed=1), name="t",
                    workers=0, progress=False)
    assert other.digest() != one.digest()


def test_prepare_refuses_too_little_text(tmp_path, assets_dir):
    src = _write_corpus(tmp_path / "src", "txt", ["tiny"])
    with pytest.raises(PrepareError):
        prepare(str(src), str(assets_dir / "tokenizer"), tmp_path / "o", Geometry(512, 4, 2), name="t",
                workers=0, progress=False)
    (tmp_path / "mixed").mkdir()
    (tmp_path / "mixed" / "a.txt").write_text("x")
    (tmp_path / "mixed" / "b.jsonl").write_text("{}")
    with pytest.raises(PrepareError, match="mixed"):
        prepare(str(tmp_path / "mixed"), str(assets_dir / "tokenizer"), tmp_path / "o2", GEOMETRY, name="t",
                workers=0, progress=False)


def test_manifest_parsing_rejects_bad_input(tiny_pages: LocalCorpus):
    good = tiny_pages.manifest.canonical()
    digest = tiny_pages.manifest.digest()
    assert parse_manifest(good, expected_digest=digest) == tiny_pages.manifest
    with pytest.raises(ManifestError, match="does not match the pinned"):
        parse_manifest(good, expected_digest="0" * 64)
    with pytest.raises(ManifestError, match="not JSON"):
        parse_manifest(good[: len(good) // 2])
    with pytest.raises(ManifestError, match="not JSON"):
        parse_manifest(b"\xff\xfe garbage")
    raw = json.loads(good)
    for mutate, reason in [
        (lambda r: r.update(extra=1), "extra"),
        (lambda r: r["shards"][0].update(pages=r["shards"][0]["pages"] + 1), "bytes"),
        (lambda r: r["shards"][0].update(key="../../etc/passwd"), "shards/"),
        (lambda r: r.update(sequence_length="128"), "sequence_length"),
        (lambda r: r["tokenizer"].update(vocab_size=1 << 20), "does not fit"),
    ]:
        bad = json.loads(good)
        mutate(bad)
        with pytest.raises(ManifestError, match=reason):
            parse_manifest(json.dumps(bad, sort_keys=True, separators=(",", ":")).encode())
    with pytest.raises(ManifestError, match="canonical"):
        parse_manifest(json.dumps(raw, indent=1).encode())


def test_local_corpus_detects_a_corrupted_page(tmp_path, assets_dir):
    src = _write_corpus(tmp_path / "src", "jsonl", _docs())
    out = tmp_path / "out"
    m = prepare(str(src), str(assets_dir / "tokenizer"), out, GEOMETRY, name="t", workers=0, progress=False)
    shard = out / m.shards[0].key
    data = bytearray(shard.read_bytes())
    data[m.page_bytes + 3] ^= 0xFF  # page 1
    shard.write_bytes(bytes(data))
    corpus = LocalCorpus(out, digest=m.digest())
    corpus.page(0)
    with pytest.raises(PageError):
        corpus.page(1)
