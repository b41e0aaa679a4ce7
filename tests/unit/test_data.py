"""Deterministic page assignment and offline corpus loading."""

import json
from pathlib import Path

import numpy as np
import pytest

from templar.data import (
    MAX_UIDS,
    PagePlan,
    PageStore,
    assigned_pages,
    load_tokenizer,
    random_pages,
    tokenize_corpus,
)

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


def test_random_pages_function_form():
    pages = random_pages(1337, 3, 4, NUM_PAGES, pages_per_uid=2, holdout_fraction=0.02)
    assert pages == random_pages(1337, 3, 4, NUM_PAGES, pages_per_uid=2, holdout_fraction=0.02)
    assert len(set(pages)) == 4


def test_uid_out_of_range_is_refused():
    with pytest.raises(ValueError):
        PagePlan.build(NUM_PAGES, 0.0, 1, 2).assigned_pages(MAX_UIDS, 0, 2)


def test_pages_have_the_preset_shape(tiny_pages: PageStore):
    assert tiny_pages.num_pages == NUM_PAGES
    page = tiny_pages.page(123)
    assert page.shape == (4, 128) and page.dtype.is_floating_point is False
    assert tiny_pages.batch([1, 2]).shape == (8, 128)
    with pytest.raises(IndexError):
        tiny_pages.page(NUM_PAGES)


@pytest.mark.parametrize("kind", ["txt", "jsonl", "parquet"])
def test_local_sources_load_offline(tmp_path, assets_dir, kind):
    docs = [f"Document number {i}. " * 20 for i in range(30)]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    if kind == "txt":
        (corpus / "a.txt").write_text("\n".join(docs))
    elif kind == "jsonl":
        (corpus / "a.jsonl").write_text("\n".join(json.dumps({"body": d}) for d in docs))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"body": docs}), corpus / "a.parquet")
    tokens = tokenize_corpus(corpus, assets_dir / "tokenizer", text_field="body")
    tok = load_tokenizer(assets_dir / "tokenizer")
    assert int(np.sum(np.asarray(tokens) == tok.eos_token_id)) == len(docs)
    assert tok.decode(np.asarray(tokens[:8]).tolist()).startswith("Document number 0.")
    cached = tokenize_corpus(corpus, assets_dir / "tokenizer", text_field="body")
    assert np.array_equal(np.asarray(cached), np.asarray(tokens))


def _tokenize_in_child(args):
    corpus, tokenizer = args
    return len(tokenize_corpus(Path(corpus), Path(tokenizer), text_field="text"))


def test_concurrent_tokenizers_share_one_cache(tmp_path, assets_dir):
    """A localnet starts many neurons at once: none may fail while another writes the cache."""
    import multiprocessing

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.jsonl").write_text("\n".join(json.dumps({"text": f"Line {i}. " * 200}) for i in range(300)))
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        sizes = pool.map(_tokenize_in_child, [(str(corpus), str(assets_dir / "tokenizer"))] * 3)
    assert len(set(sizes)) == 1 and sizes[0] > 0
    assert not list((corpus / ".cache").glob("*.tmp.npy"))
