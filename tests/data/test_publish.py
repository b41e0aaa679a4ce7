"""Publishing a run's corpus as docs/launch.md does it: a streamed dataset through the same code path
as a hub one, a bucket checked before any tokenizing, and `verify` saying what to do when the
corpus is not the pinned one or too small for disjoint assignments."""

from __future__ import annotations

import json

import pytest

from templar.cli import main
from templar.core.config import load_hparams
from templar.data.plan import MAX_UIDS, PagePlan, disjoint_assignment_pages
from templar.data.prepare import Geometry, prepare

GEOMETRY = Geometry(sequence_length=32, sequences_per_page=2, pages_per_shard=8)


def _documents(assets_dir, n: int) -> list[str]:
    with open(assets_dir / "corpus" / "wiki.jsonl", encoding="utf-8") as f:
        return [json.loads(line)["text"] for _, line in zip(range(n), f, strict=False)]


def test_a_streamed_dataset_gives_the_local_files_corpus(tmp_path, assets_dir, monkeypatch):
    """`hub:<dataset>` goes through `datasets.load_dataset(..., streaming=True)`, as FineWeb-Edu
    does on an online machine; here the dataset is a local folder (no network), read by that same
    call. Same documents in the same order: the same corpus, byte for byte, as from the files."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    docs = _documents(assets_dir, 60)
    dataset = tmp_path / "dataset"
    dataset.mkdir()
    (dataset / "train.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    tokenizer = str(assets_dir / "tokenizer")
    streamed = prepare(f"hub:{dataset}", tokenizer, tmp_path / "a", GEOMETRY, name="sample", workers=0,
                       progress=False)
    local = prepare(str(dataset), tokenizer, tmp_path / "b", GEOMETRY, name="sample", workers=0, progress=False)
    assert streamed.digest() == local.digest() and streamed.num_pages > 8
    import templar.data.prepare as prep

    monkeypatch.setattr(prep, "DOCS_PER_TASK", 4)  # the stream is read no further than needed
    capped = prepare(f"hub:{dataset}", tokenizer, tmp_path / "c", GEOMETRY, name="sample", workers=0,
                     progress=False, max_tokens=10 * GEOMETRY.page_tokens + 5)
    assert capped.num_pages == 10 and capped.documents < len(docs)


def test_prepare_checks_the_bucket_before_tokenizing(tmp_path, assets_dir, seaweed, monkeypatch, capsys,
                                                     refused_port):
    """A server that is down, or a write key it refuses, ends `prepare` before any tokenizing,
    with what to fix; the work folder stays empty."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in _documents(assets_dir, 20)))
    monkeypatch.setenv("TEMPLAR_BUCKET_WRITE_KEY_ID", seaweed.admin.access_key_id)
    monkeypatch.setenv("TEMPLAR_BUCKET_WRITE_SECRET", seaweed.admin.secret_access_key)
    down = f"s3:http://127.0.0.1:{refused_port}|corpus|{seaweed.reader.access_key_id}|" \
           f"{seaweed.reader.secret_access_key}"
    bucket = seaweed.create_bucket("prepare-preflight")
    up = seaweed.locator(bucket).encode()
    work = tmp_path / "work"

    def run(out: str) -> int:
        return main(["data", "prepare", str(src), "--tokenizer", str(assets_dir / "tokenizer"), "--hparams", "tiny",
                     "--out", out, "--work", str(work), "--no-progress"])

    assert run(down) == 1
    out = capsys.readouterr().out
    assert "nothing was tokenized" in out and "fix: check the locator's endpoint" in out, out
    assert not work.exists()
    monkeypatch.setenv("TEMPLAR_BUCKET_WRITE_SECRET", "not-the-secret")
    assert run(up) == 1
    assert "the write key was refused" in capsys.readouterr().out and not work.exists()
    assert run("") == 2 and "--out is empty" in capsys.readouterr().out
    monkeypatch.setenv("TEMPLAR_BUCKET_WRITE_SECRET", seaweed.admin.secret_access_key)
    assert run(up) == 0
    out = capsys.readouterr().out
    assert "pages are fewer than the 522 that keep assignments from overlapping" in out  # 20 articles: few pages


def test_verify_says_how_to_pin_and_warns_of_overlapping_assignments(tmp_path, assets_dir, capsys):
    docs = _documents(assets_dir, 40)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    corpus = tmp_path / "corpus"
    assert main(["data", "prepare", str(tmp_path / "src"), "--tokenizer", str(assets_dir / "tokenizer"),
                 "--hparams", "tiny", "--out", str(corpus), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["data", "verify", str(corpus), "--hparams", "tiny"]) == 1
    out = capsys.readouterr().out
    assert "templar data pin CORPUS --hparams RUN_FILE" in out and "pass --digest " in out, out
    pages = int(out.split(" pages, digest")[0].rsplit(" ", 1)[1].replace(",", ""))
    needed = disjoint_assignment_pages(2, load_hparams("tiny").data.holdout_fraction)
    assert f"warning: {pages:,} pages are fewer than the {needed:,}" in out
    digest = out.split("pass --digest ")[1].split()[0]
    assert main(["data", "verify", str(corpus), "--digest", digest]) == 0


@pytest.mark.parametrize("pages_per_window,holdout", [(2, 0.02), (16, 0.0), (16, 0.01), (3, 0.3)])
def test_the_disjoint_assignment_threshold_is_the_smallest_that_works(pages_per_window, holdout):
    """`disjoint_assignment_pages` is exactly where every uid slot first fits outside the held-out set."""
    needed = disjoint_assignment_pages(pages_per_window, holdout)
    fits = PagePlan.build(needed, holdout, 0, pages_per_window)
    assert fits.pool >= MAX_UIDS * pages_per_window
    assert PagePlan.build(needed - 1, holdout, 0, pages_per_window).pool < MAX_UIDS * pages_per_window
    slots = [fits.assigned_pages(uid, 7, pages_per_window) for uid in range(MAX_UIDS)]
    assert len({p for slot in slots for p in slot}) == MAX_UIDS * pages_per_window
