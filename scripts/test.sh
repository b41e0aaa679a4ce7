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
# One pytest worker per core, plus one (at most 5): the long tests run first, one per worker
# (tests/conftest.py), and each worker's torch keeps to one thread. About a third of the long tests'
# time is waiting (neuron processes importing torch, real-time windows, torchrun rendezvous); the
# extra worker fills it: on 2 cores -n 2 took 261 s, -n 3 235 s, -n 4 232 s (767 tests, quiet machine);
# with 1,260 tests (2026-11-29, fresh clones) 559 s, 490 s and 487 s: a fourth worker finds nothing left to fill.
workers="${TEMPLAR_TEST_WORKERS:-$(( $(nproc) + 1 ))}"
[ "$workers" -gt 5 ] && workers=5
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
echo "[test] pytest ($workers workers${scratch:+, scratch in $scratch})"
set +e
"$venv/bin/python" -m pytest -q -n "$workers" --maxschedchunk 1 ${scratch:+--basetemp "$scratch"} "$@"
rc=$?
set -e
if [ -n "$scratch" ]; then
  if [ "$rc" -eq 0 ]; then rm -rf "$scratch"; else echo "[test] the failed tests' directories: $scratch"; fi
fi
exit "$rc"
