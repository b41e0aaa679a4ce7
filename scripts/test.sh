#!/usr/bin/env bash
# The README's test command: set up (if needed), lint, then run the whole test suite.
# Extra arguments go to pytest (e.g. scripts/test.sh -k wire -x).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
venv="${TEMPLAR_VENV:-$root/.venv}"
cd "$root"
echo "[test] ruff"
"$venv/bin/ruff" check src neurons scripts tests benchmarks
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# One pytest worker per core, plus two (at most 6), each worker's torch on one thread. The long tests
# run first (tests/conftest.py): those that mostly wait (real-time localnets, kill -9 of real processes,
# the launch rehearsal) in two lanes, the other workers on tests that compute, so the cores stay busy
# while the waiting tests wait. On 2 cores (2026-12-01, 1,332 tests): 3 workers, the waiting tests
# started together, 300 s of pytest (the cores 83-84 % busy); 4 workers in two lanes 269-272 s (93-94 %).
# The suite is bound by its CPU: 2026-12-04 (1,572 tests), 4 workers 286-293 s of pytest, 530 CPU-s in all; 5 workers left
# the cores idle 7 CPU-s instead of 26 and took 294 s. What each test costs: TEMPLAR_TEST_CPU_LOG=DIR scripts/test.sh,
# then python -m tests.cpu_log DIR (tests/cpu_log.py).
# (GNU nproc counts OMP_NUM_THREADS as the cores there are: a shell with it set to 1 would get 3 workers)
cores="$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)"
workers="${TEMPLAR_TEST_WORKERS:-$(( cores + 2 ))}"
[ "$workers" -gt 6 ] && workers=6
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# glibc hands every tensor over 32 MB back to the kernel on free and maps it anew (zeroed) on the next
# allocation: 31 M page faults and 97 s of system time per suite. Keeping freed memory in the heap
# for reuse halves the system time of a localnet test (5.6 -> 2.8 s) and its page faults (2.3 M -> 0.7 M).
export MALLOC_MMAP_THRESHOLD_="${MALLOC_MMAP_THRESHOLD_:-33554432}" MALLOC_TRIM_THRESHOLD_="${MALLOC_TRIM_THRESHOLD_:-1073741824}"
export MALLOC_TOP_PAD_="${MALLOC_TOP_PAD_:-268435456}"
# The localnets write about 25 GB of state files and payloads per suite, each fsynced: on a disk that was
# 114 s of system time and 537 s of pytest, on tmpfs 92 s and 523 s (2026-11-30, 2 cores). Where
# /dev/shm has room (a passing test's directory is deleted as it passes: at most 1.5 GB at once), the
# tests' scratch goes there, and goes when the suite passes; elsewhere it is pytest's default.
scratch=""
shm_free_mb=$(df --output=avail -BM /dev/shm 2>/dev/null | tail -1 | tr -dc 0-9 || true)
if [ "${shm_free_mb:-0}" -ge 4096 ]; then
  scratch="/dev/shm/pytest-suite-$$"
fi
# Bytecode for every module the suite's ~45 Python processes import, written once (0.4 s): where
# PYTHONDONTWRITEBYTECODE is set (as in many containers), each process would compile them anew.
"$venv/bin/python" -m compileall -q -j 0 src neurons scripts benchmarks tests >/dev/null
# pytest's rewritten test modules, likewise once for every worker (there, each worker rewrote all of
# them: about 4 CPU-s per worker; scripts/warm_assert_rewrites.py says why and when it does nothing).
"$venv/bin/python" scripts/warm_assert_rewrites.py
echo "[test] pytest ($workers workers${scratch:+, scratch in $scratch})"
# The suite is bound by its CPU, and hosts differ: after pytest, one line with its wall time and the CPU it
# and every process it waited for spent (bash's `times`: user and system of this shell's reaped children).
cpu_log="$(mktemp)" started=$SECONDS
times > "$cpu_log"  # in this shell: a command substitution's subshell would count only its own children
set +e
"$venv/bin/python" -m pytest -q -n "$workers" --maxschedchunk 1 ${scratch:+--basetemp "$scratch"} "$@"
rc=$?
set -e
times >> "$cpu_log"
awk -v before="$(sed -n 2p "$cpu_log")" -v after="$(sed -n 4p "$cpu_log")" -v wall=$((SECONDS - started)) -v cores="$cores" '
  function seconds(t,  p) { split(t, p, "m"); return p[1] * 60 + substr(p[2], 1, length(p[2]) - 1) }
  BEGIN { split(before, b, " "); split(after, a, " ")
          user = seconds(a[1]) - seconds(b[1]); sys = seconds(a[2]) - seconds(b[2])
          printf "[test] pytest: %d s, %.0f CPU-s (user %.0f, system %.0f): %.0f s of CPU on each of %d cores\n",
                 wall, user + sys, user, sys, (user + sys) / cores, cores }'
rm -f "$cpu_log"
if [ -n "$scratch" ]; then
  if [ "$rc" -eq 0 ]; then rm -rf "$scratch"; else echo "[test] the failed tests' directories: $scratch"; fi
fi
exit "$rc"
