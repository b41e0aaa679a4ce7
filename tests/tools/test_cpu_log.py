"""tests/cpu_log.py: with TEMPLAR_TEST_CPU_LOG set, every test of a run under xdist leaves one line in its worker's file
with its CPU, its children's and its marker, and the report sums them and names what mostly waits."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.cpu_log import main, read_records, summarise

from templar.core.config import REPO_ROOT as ROOT

SAMPLE = '''
import subprocess, sys, time
import pytest

def test_computes():
    sum(i * i for i in range(3_000_000))

@pytest.mark.slow(seconds=3)
def test_a_child_computes():
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], check=True)

def test_waits():
    time.sleep(2.1)

@pytest.mark.slow(seconds=3, waits=True)
def test_waits_and_says_so():
    time.sleep(2.1)
'''


@pytest.mark.slow(seconds=5, waits=True)  # its sample's two tests sleep 2.1 s
def test_each_test_leaves_its_cpu_and_the_report_names_what_waits_unmarked(tmp_path: Path, capsys) -> None:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    (tmp_path / "conftest.py").write_text("from tests.cpu_log import pytest_configure\n")  # as tests/conftest.py does
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: a long test\n")
    logs = tmp_path / "cpu"
    env = {**os.environ, "TEMPLAR_TEST_CPU_LOG": str(logs), "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "test_sample.py"],
                         cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    records = {r["test"].split("::")[1]: r for r in read_records(logs)}
    assert set(records) == {"test_computes", "test_a_child_computes", "test_waits", "test_waits_and_says_so"}
    assert len({r["worker"] for r in records.values()}) == 2 and len(list(logs.glob("gw*.jsonl"))) == 2
    assert records["test_computes"]["cpu"] > 0.05 and records["test_computes"]["children"] == 0
    assert records["test_a_child_computes"]["children"] > 0.05  # the child's CPU, reaped within the test
    assert records["test_a_child_computes"]["slow_seconds"] == 3 and not records["test_a_child_computes"]["waits"]
    assert records["test_waits"]["wall"] >= 2.1 and records["test_waits"]["cpu"] < 0.5
    assert records["test_waits_and_says_so"]["waits"]

    report = summarise(list(records.values()), cores=2, top=2)
    assert report.startswith("4 tests on 2 worker(s): ")
    waiting = report.split("without slow(waits=True): ")[1].splitlines()
    assert waiting[0] == "1" and len(waiting) == 2 and waiting[1].endswith("test_sample.py::test_waits"), report
    costliest = report.split("the 2 costliest tests")[1].split("\n\n")[0].splitlines()[1:]
    assert len(costliest) == 2 and all("waits" not in line.split("::")[-1] for line in costliest), report
    assert main([str(logs), "--top", "1"]) == 0 and "the 1 costliest files" in capsys.readouterr().out


def test_without_the_variable_nothing_is_written(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text("def test_one():\n    pass\n")
    (tmp_path / "conftest.py").write_text("from tests.cpu_log import pytest_configure\n")
    env = {k: v for k, v in os.environ.items() if k != "TEMPLAR_TEST_CPU_LOG"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_sample.py"],
                         cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert not any(tmp_path.rglob("*.jsonl")) and summarise([]) == "no tests recorded"
