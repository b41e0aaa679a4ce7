"""The repository stands alone: no file cites a document a clone does not hold.

A reader who clones the project has its docs and nothing else, so every citation must land inside
the repository: no design file, issue tracker number or private seed file from outside it, every
relative markdown link names a tracked file, and every `file.md §N` reference names a section the
file has (the docs number their sections `## N. Title`). Fast: `git ls-files` and text only.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()
TEXT_SUFFIXES = {".py", ".md", ".json", ".toml", ".sh", ".c", ".h", ".js", ".css", ".txt", ".cfg", ".ini",
                 ".yml", ".yaml", ".typed", ".gitignore", ""}

# Citations of documents outside the repository. Each pattern is written so that it does not
# match itself (this file is skipped anyway).
FORBIDDEN = {
    "the design file outside the repository (cite docs/design.md)": re.compile(r"\bDESIGN(?:\.md| ?§)"),
    "an issue number (say the rule, or cite the doc that holds it)": re.compile(
        r"\b[Ii]ssues? #?\d+|(?:^|[\s(`'\"])(?:pre-)?#\d{1,4}\b(?![0-9a-fA-F])|\bpre-#"),
    "a seed file (cite the public source by name)": re.compile(
        r"\bseeds? 0\d\d\b|\bseeds? \d{3} and \d{3}\b|\b\d{3}_[0-9a-f]{16}\b|seeds/"),
    "a path outside the repository": re.compile(r"\.\./shared\b|/work/shared\b"),
    "the red team, who is not in the repository (name the adversary or the rule)": re.compile(
        r"\bred team\b", re.IGNORECASE),
}

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
SECTION_REF = re.compile(
    r"(?:\[[^\]]*\]\((?P<target>[^)\s#]+\.md)\)|(?P<path>[\w./-]+\.md))`?,? (?P<refs>§\d+(?:(?:,| and| or) §\d+)*)")
HEADING = re.compile(r"^#{2,3} (\d+)\.", re.MULTILINE)
TOP_FOLDERS = ("benchmarks", "deploy", "docs", "hparams", "neurons", "scripts", "src", "tests")
REPO_PATH = re.compile(r"(?<![\w./@-])((?:" + "|".join(TOP_FOLDERS) + r")/[\w./@-]*)([<{*]?)")
"""A path into the repository's own folders, and the character after it (`<`, `{` or `*`: a template)."""
WRITTEN_LATER = {
    "benchmarks/.gpu_wheels": "git-ignored: benchmarks/performance/gpu_wheels.sh downloads the wheels there",
    "hparams/local.json": "an operator's own hparams, saved by hand (docs/mining.md §6)",
}
"""Paths the docs name that no checkout holds: each is made later, by a script or by hand."""
BENCHMARK_MODULE = re.compile(r"(?<![\w.])benchmarks(?:\.\w+)+")


@cache
def tracked() -> tuple[str, ...]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return tuple(p for p in out.decode().split("\0") if p)


def text_files() -> list[str]:
    files = []
    for path in tracked():
        if path == SELF or Path(path).suffix not in TEXT_SUFFIXES or not (ROOT / path).is_file():
            continue
        try:
            (ROOT / path).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        files.append(path)
    return files


@cache
def read(path: str) -> str:
    return (ROOT / path).read_text(encoding="utf-8")


def is_tracked(path: Path) -> bool:
    """A tracked file, or a folder holding one."""
    rel = path.resolve().relative_to(ROOT).as_posix() if path.resolve().is_relative_to(ROOT) else None
    if rel is None:
        return False
    return rel in tracked() or any(p.startswith(rel + "/") for p in tracked())


def resolve_doc(source: str, name: str) -> str | None:
    """The tracked file a citation of `name` in `source` means: relative to the citing file, the
    repository root, or docs/ (prose cites `scoring.md` from anywhere)."""
    for base in (ROOT / source).parent, ROOT, ROOT / "docs":
        candidate = (base / name).resolve()
        if candidate.is_relative_to(ROOT) and candidate.relative_to(ROOT).as_posix() in tracked():
            return candidate.relative_to(ROOT).as_posix()
    return None


@cache
def sections(path: str) -> frozenset[int]:
    return frozenset(int(n) for n in HEADING.findall(read(path)))


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


@pytest.mark.slow(seconds=3)
def test_no_file_cites_a_document_outside_the_repository() -> None:
    found = []
    for path in text_files():
        text = read(path)
        for reason, pattern in FORBIDDEN.items():
            found += [f"{path}:{line_of(text, m.start())}: {m.group(0).strip()!r}: {reason}"
                      for m in pattern.finditer(text)]
    assert not found, "\n".join(found)


def test_every_relative_markdown_link_points_at_a_tracked_file() -> None:
    broken = []
    for path in (p for p in text_files() if p.endswith(".md")):
        text = read(path)
        for m in LINK.finditer(text):
            target = m.group(1).split("#", 1)[0]
            if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target):  # an anchor, http:, mailto:
                continue
            if not is_tracked((ROOT / path).parent / target):
                broken.append(f"{path}:{line_of(text, m.start())}: {m.group(0)}")
    assert not broken, "links to files that are not in the repository:\n" + "\n".join(broken)


def test_every_numbered_section_reference_names_a_section_of_a_tracked_doc() -> None:
    bad = []
    for path in text_files():
        text = read(path)
        for m in SECTION_REF.finditer(text):
            where = f"{path}:{line_of(text, m.start())}: {m.group(0)!r}"
            doc = resolve_doc(path, m.group("target") or m.group("path"))
            if doc is None:
                bad.append(f"{where}: no such file in the repository")
                continue
            missing = [n for n in map(int, re.findall(r"§(\d+)", m.group("refs"))) if n not in sections(doc)]
            if missing:
                bad.append(f"{where}: {doc} has no section {missing} (it has {sorted(sections(doc))})")
    assert not bad, "\n".join(bad)


def test_every_repository_path_a_doc_names_exists() -> None:
    """Every `src/…`, `benchmarks/…`, `docs/…` (and the other top folders) path in a markdown file
    is a tracked file or folder; templates (`gpu_<device>.json`, `templar-*@.service`) are skipped."""
    missing = []
    for path in (p for p in text_files() if p.endswith(".md")):
        text = read(path)
        for m in REPO_PATH.finditer(text):
            name = m.group(1).rstrip("/.-")
            if m.group(2) or name in WRITTEN_LATER or is_tracked(ROOT / name):
                continue
            missing.append(f"{path}:{line_of(text, m.start())}: {name}")
    assert not missing, "paths that are not in the repository:\n" + "\n".join(missing)


def test_every_benchmark_a_file_names_exists() -> None:
    """Benchmarks are named as paths (`benchmarks/performance/gpu.py`) and run as modules
    (`python -m benchmarks.performance.gpu`); in any file, both name a tracked script or package. The
    results are records of past runs: they keep the names their run had."""
    missing = []
    for path in (p for p in text_files() if not p.startswith("benchmarks/results/")):
        text = read(path)
        for m in REPO_PATH.finditer(text):
            name = m.group(1).rstrip("/.-")
            if name.startswith("benchmarks/") and not (
                    m.group(2) or name in WRITTEN_LATER or is_tracked(ROOT / name)):
                missing.append(f"{path}:{line_of(text, m.start())}: {name}")
        for m in BENCHMARK_MODULE.finditer(text):
            module = m.group(0).replace(".", "/")
            if not (is_tracked(ROOT / f"{module}.py") or is_tracked(ROOT / module / "__init__.py")):
                missing.append(f"{path}:{line_of(text, m.start())}: {m.group(0)}")
    assert not missing, "benchmarks that are not in the repository:\n" + "\n".join(missing)


def test_repository_paths_are_found_with_their_templates() -> None:
    found = [(m.group(1), m.group(2)) for m in REPO_PATH.finditer(
        "run `python benchmarks/performance/gpu.py`, write benchmarks/results/gpu_<device>.json; "
        "copy deploy/systemd/templar-*@.service and deploy/systemd/templar-miner@.service (docs/mining.md).")]
    assert found == [("benchmarks/performance/gpu.py", ""), ("benchmarks/results/gpu_", "<"),
                     ("deploy/systemd/templar-", "*"), ("deploy/systemd/templar-miner@.service", ""),
                     ("docs/mining.md", "")]
    assert [m.group(0) for m in BENCHMARK_MODULE.finditer("python -m benchmarks.incentive.subnet_sim; "
                                                         "from benchmarks._common import emit")] == [
        "benchmarks.incentive.subnet_sim", "benchmarks._common"]


@pytest.mark.parametrize("text, reason", [
    ("see DESIGN.md section 6", "design"),
    ("(DESIGN §2)", "design"),
    ("(issue 14: borrowed work)", "issue"),
    ("issue #17 §5", "issue"),
    ("1 process (pre-#17)", "issue"),
    ("a fix for #15 here", "issue"),
    ("(seeds 000 and 002)", "seed"),
    ("(seed 004, eqs. 2-5)", "seed"),
    ("../shared/seeds/003_f25ca8e30516165b.txt", "path"),
    ("The red team's cheat", "red team"),
])
def test_the_forbidden_patterns_catch_each_form(text: str, reason: str) -> None:
    assert any(reason in why and pattern.search(text) for why, pattern in FORBIDDEN.items())


@pytest.mark.parametrize("text", [
    "--good: #16a34a; --accent: #2563eb;",    # CSS colours
    "seeds 0-2 of the chosen rows",
    "## 12. Many GPUs",
    "we issue BEGIN ourselves",
    "docs/design.md §3",
])
def test_the_forbidden_patterns_leave_ordinary_text_alone(text: str) -> None:
    assert not any(pattern.search(text) for pattern in FORBIDDEN.values())


def test_section_references_are_parsed_with_their_lists() -> None:
    refs = [(m.group("target") or m.group("path"), m.group("refs")) for m in SECTION_REF.finditer(
        "see [benchmarks/LOG.md](../benchmarks/LOG.md) §1, §2 and §5; docs/scoring.md §8 and "
        "[the statuses](validating.md) §6")]
    assert refs == [("../benchmarks/LOG.md", "§1, §2 and §5"), ("docs/scoring.md", "§8"), ("validating.md", "§6")]
