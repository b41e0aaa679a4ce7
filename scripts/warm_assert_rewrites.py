"""Write pytest's rewritten test modules to their cache before the suite's workers start.

pytest rewrites every test module's `assert`s (parse, rewrite, compile) and caches the result in
`__pycache__/*.cpython-311-pytest-<version>.pyc`, but only where bytecode may be written: under
PYTHONDONTWRITEBYTECODE (set in many containers, and in this project's CI image) each of the suite's
workers rewrote all ~150 test modules again, about 4 CPU-seconds per worker on 2 cores (collection
9.0 -> 5.0 s; the cached file is hash-checked, so a worker never reads a stale one and reads it
whatever PYTHONDONTWRITEBYTECODE says). This script rewrites them once, in parallel, the way pytest's
own import hook does; a worker finding no cache (another pytest version, a file edited since) simply
rewrites that module itself, as before.

It uses pytest's rewrite functions, which are not public API: if they move, it says so and exits 0,
and the suite runs exactly as it did without it.

    python scripts/warm_assert_rewrites.py [ROOT]     # default: the repository's tests/
"""

from __future__ import annotations

import os
import sys
import tomllib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _rewritten_by_pytest(root: Path) -> list[Path]:
    """The modules pytest's import hook rewrites in this project: its test files and conftests."""
    return sorted(p for p in root.rglob("*.py") if p.name == "conftest.py" or
                  (p.name.startswith("test_") and "__pycache__" not in p.parts))


def _warm(path: Path) -> bool:
    """Rewrite one module and write its cache file atomically, as pytest's hook does; False if not written."""
    from _pytest.assertion import rewrite

    pyc = rewrite.get_cache_dir(path) / (path.name[:-3] + rewrite.PYC_TAIL)
    source_hash, code = rewrite._rewrite_test(path, None)  # config=None: the ini's assertion-pass hook is off here too
    pyc.parent.mkdir(parents=True, exist_ok=True)
    partial = pyc.with_name(f"{pyc.name}.{os.getpid()}")
    with open(partial, "wb") as fp:
        rewrite._write_pyc_fp(fp, source_hash, code)
    os.replace(partial, pyc)
    return True


def main() -> int:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests"
    try:
        from _pytest.assertion import rewrite

        for name in ("get_cache_dir", "PYC_TAIL", "_rewrite_test", "_write_pyc_fp"):
            getattr(rewrite, name)
    except (ImportError, AttributeError) as e:
        print(f"[test] not warming pytest's rewrite cache: {e} (the workers rewrite the test modules themselves)")
        return 0
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    if "enable_assertion_pass_hook" in ini:  # then the workers' rewrite reads the ini, which this one does not
        print("[test] not warming pytest's rewrite cache: the ini sets enable_assertion_pass_hook")
        return 0
    paths = _rewritten_by_pytest(root)
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        written = sum(pool.map(_warm, paths, chunksize=8))
    print(f"[test] pytest's rewrite cache: {written} test modules")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
