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
echo "[test] pytest ($workers workers)"
exec "$venv/bin/python" -m pytest -q -n "$workers" --maxschedchunk 1 "$@"
