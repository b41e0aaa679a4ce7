"""What each test costs the suite in CPU: `TEMPLAR_TEST_CPU_LOG=DIR ./scripts/test.sh`, then
`python -m tests.cpu_log DIR`.

The suite's budget is wall time on 2 cores, and scripts/test.sh runs four workers on them, so a test's
wall time (`pytest --durations`) counts the seconds it waited for a core another worker held: the pay
localnet took 53 s of wall time in a whole run and 38 s of CPU, alone 37 and 36. What the suite costs is
the CPU all its tests spend, divided by the cores, plus whatever time the cores sit idle because every
worker is waiting on real time (a restarted process, a deadline). So, with `TEMPLAR_TEST_CPU_LOG` set,
each worker writes one JSON line per test to DIR/<worker>.jsonl: the worker's CPU during the test (every
thread), the CPU of the child processes it reaped during the test (a process reaped later counts where
it was reaped; one never reaped by the worker is not counted), its start, end and wall time, and its
`slow` marker. The report sums them, names the tests and files that cost most, and lists the tests that
mostly wait without `slow(waits=True)`, which tests/conftest.py's schedule would run in its lanes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

LOG_ENV = "TEMPLAR_TEST_CPU_LOG"
"""The directory each worker writes its tests' lines to; unset, nothing is measured."""
WAITING_SECONDS = 2.0
WAITING_SHARE = 0.25
"""A test counts as mostly waiting when it took at least `WAITING_SECONDS` of wall time and spent at most
this share of it on CPU: well below the half core each of four workers gets on 2 cores."""


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


class CpuLog:
    """The plugin: one line per test, appended to this worker's file as the test ends."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{os.getpid()}.jsonl"

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
        start, cpu, children = time.time(), _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
        yield
        end = time.time()
        marker = item.get_closest_marker("slow")
        record = {"test": item.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
                  "start": start, "end": end, "wall": end - start, "cpu": _cpu(resource.RUSAGE_SELF) - cpu,
                  "children": _cpu(resource.RUSAGE_CHILDREN) - children,
                  "slow_seconds": marker.kwargs.get("seconds", 10) if marker else None,
                  "waits": bool(marker and marker.kwargs.get("waits", False))}
        with self.path.open("a") as out:
            out.write(json.dumps(record) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    """Register the plugin when `TEMPLAR_TEST_CPU_LOG` names a directory (tests/conftest.py calls this)."""
    if (directory := os.environ.get(LOG_ENV)) and not config.pluginmanager.has_plugin("templar-cpu-log"):
        config.pluginmanager.register(CpuLog(Path(directory)), "templar-cpu-log")
        if not (getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput")):
            os.environ.pop(LOG_ENV)  # what runs the tests: a pytest the tests start themselves logs nothing here


def read_records(directory: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(directory.glob("*.jsonl")) for line in path.read_text().splitlines()
            if line.strip()]


def summarise(records: list[dict], cores: int = 2, top: int = 20) -> str:
    """The report: totals, what the cores could do at best, and the costliest and mostly-waiting tests."""
    if not records:
        return "no tests recorded"
    cost = {r["test"]: r["cpu"] + r["children"] for r in records}
    total, workers = sum(cost.values()), {r["worker"] for r in records}
    span = max(r["end"] for r in records) - min(r["start"] for r in records)
    lines = [f"{len(records)} tests on {len(workers)} worker(s): {sum(r['cpu'] for r in records):.1f} CPU-s in the "
             f"workers, {sum(r['children'] for r in records):.1f} in child processes, {total:.1f} in all",
             f"first start to last end {span:.1f} s; the tests' CPU alone needs {total / cores:.1f} s on {cores} "
             f"cores (busy {total / max(span * cores, 1e-9):.0%} of that span with tests' work)", "",
             f"the {top} costliest tests (CPU-s, wall s, marker):"]
    for r in sorted(records, key=lambda r: -cost[r["test"]])[:top]:
        marker = "" if r["slow_seconds"] is None else f"slow({r['slow_seconds']}{', waits' if r['waits'] else ''})"
        lines.append(f"  {cost[r['test']]:7.1f} {r['wall']:7.1f}  {marker:16s} {r['test']}")
    by_file = Counter()
    for test, seconds in cost.items():
        by_file[test.split("::")[0]] += seconds
    lines += ["", f"the {top} costliest files (CPU-s, share):"]
    lines += [f"  {seconds:7.1f} {seconds / total:6.1%}  {name}" for name, seconds in by_file.most_common(top)]
    waiting = [r for r in records if r["wall"] >= WAITING_SECONDS and cost[r["test"]] <= WAITING_SHARE * r["wall"]
               and not r["waits"]]
    lines += ["", f"mostly waiting (at least {WAITING_SECONDS:g} s of wall time, at most {WAITING_SHARE:.0%} of it on "
              f"CPU) without slow(waits=True): {len(waiting)}"]
    lines += [f"  {r['wall']:7.1f} {cost[r['test']]:7.1f}  {r['test']}" for r in sorted(waiting, key=lambda r: -r["wall"])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Sum up the CPU each test of a suite run spent (TEMPLAR_TEST_CPU_LOG).")
    parser.add_argument("directory", type=Path)
    parser.add_argument("--cores", type=int, default=2, help="the cores the budget is for")
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args(argv)
    print(summarise(read_records(args.directory), args.cores, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
