"""scripts/warm_assert_rewrites.py: the suite's workers read the rewritten test modules it wrote, under
PYTHONDONTWRITEBYTECODE as CI runs them, and still say what a failed `assert` compared."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from templar.core.config import REPO_ROOT as ROOT


def test_a_warmed_module_is_read_from_the_cache_and_its_asserts_still_explain_themselves(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text("def test_sample():\n    seen = [1, 2]\n    assert seen == [1, 3]\n")
    (tmp_path / "conftest.py").write_text("")
    (tmp_path / "helper.py").write_text("VALUE = 1\n")  # not a test module: pytest never rewrites it
    warm = subprocess.run([sys.executable, str(ROOT / "scripts" / "warm_assert_rewrites.py"), str(tmp_path)],
                          capture_output=True, text=True, check=True)
    assert "2 test modules" in warm.stdout, warm.stdout
    cached = sorted(p.name for p in (tmp_path / "__pycache__").iterdir())
    assert len(cached) == 2 and all("-pytest-" in name for name in cached), cached

    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--import-mode=importlib",
                          "--debug", str(tmp_path / "debug.log"), "test_sample.py"],
                         cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 1, run.stdout
    assert "assert [1, 2] == [1, 3]" in run.stdout, run.stdout  # the rewritten assert, read from the cache
    trace = (tmp_path / "debug.log").read_text()
    assert f"found cached rewritten pyc for {tmp_path / 'test_sample.py'}" in trace
    assert f"rewriting {str(tmp_path / 'test_sample.py')!r}" not in trace

    # an edited module is not answered from the stale cache: pytest rewrites it itself
    (tmp_path / "test_sample.py").write_text("def test_sample():\n    seen = [1, 2]\n    assert seen == [1, 4]\n")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--import-mode=importlib",
                          "test_sample.py"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert "assert [1, 2] == [1, 4]" in run.stdout, run.stdout
