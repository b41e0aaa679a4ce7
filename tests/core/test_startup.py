"""A process's start-up: its imports with the cyclic garbage collector paused, then frozen
(`libraries_loading`), and room for its open files (`raise_open_files_limit`)."""

from __future__ import annotations

import gc
from types import SimpleNamespace

import pytest

from templar.core.startup import (
    OPEN_FILES_WANTED,
    libraries_loading,
    open_files_target,
    raise_open_files_limit,
)


def test_the_collector_is_paused_inside_and_what_was_built_is_frozen_after():
    frozen = gc.get_freeze_count()
    assert gc.isenabled()
    with libraries_loading():
        assert not gc.isenabled()
        built = [[i] for i in range(1000)]  # container objects: the collector tracks them
    assert gc.isenabled()
    assert gc.get_freeze_count() >= frozen + len(built)


def test_a_collector_that_was_off_stays_off_and_an_error_still_resumes_it():
    gc.disable()
    try:
        with libraries_loading():
            pass
        assert not gc.isenabled()  # the caller's choice stands
    finally:
        gc.enable()
    try:
        with libraries_loading():
            raise ImportError("a library failed to load")
    except ImportError:
        pass
    assert gc.isenabled()


def test_a_node_raises_its_open_files_limit_within_the_hard_one() -> None:
    """A soft limit of 1,024 (the usual default) left a full subnet's validator little room: every
    connection fails past it. The node asks for more, never past the hard limit the operator set."""
    resource = pytest.importorskip("resource", reason="open-file limits are POSIX")
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft, hard = before
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, soft), hard))
        raised, kept = raise_open_files_limit(wanted=8_192)
        ceiling = 8_192 if hard == resource.RLIM_INFINITY else min(8_192, hard)
        assert kept == hard and raised == ceiling == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        assert raise_open_files_limit(wanted=512) == (ceiling, hard)  # never lowered
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)


def test_what_a_node_gets_is_what_the_doctor_reports_on_linux_and_macos() -> None:
    """The doctor reports `open_files_target`; macOS's setrlimit takes no more than OPEN_MAX (10,240)
    under an unlimited hard limit, so that, not the 65,536 a node asks for, is what it gets there."""
    linux_unlimited, macos_unlimited = -1, 2**63 - 1
    assert open_files_target(1_024, linux_unlimited, platform="linux") == OPEN_FILES_WANTED
    assert open_files_target(1_024, 4_096, platform="linux") == 4_096
    assert open_files_target(256, macos_unlimited, platform="darwin") == 10_240
    assert open_files_target(256, 8_192, platform="darwin") == 8_192  # a finite hard limit is taken as it is
    assert open_files_target(12_000, macos_unlimited, platform="darwin") == 12_000  # never lowered
    assert open_files_target(-1, -1, platform="darwin") == -1


FLUSHING = """
import torch
from templar.core.startup import flushes_subnormals
before = flushes_subnormals()
torch.set_flush_denormal(True)  # what loading a library built with -ffast-math does to the process
print(before, flushes_subnormals())
"""


def test_a_process_that_flushes_subnormals_is_found_and_no_node_starts_in_it(tmp_path, monkeypatch) -> None:
    """An operator's CFLAGS=-ffast-math made the kernels' library set the CPU's flush-to-zero bits for the
    whole process as it loaded, and the node's floats near zero differed from every other node's (the
    kernels now build with -fno-fast-math after any CFLAGS; this finds any other library that does it)."""
    import asyncio
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", FLUSHING], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["False", "True"], done.stdout + done.stderr

    from templar.runtime import node as node_module

    monkeypatch.setattr(node_module, "flushes_subnormals", lambda: True)
    args = SimpleNamespace(hparams="tiny")
    with pytest.raises(node_module.StartupError, match="flushes subnormal floats to zero"):
        asyncio.run(node_module.start_node(args, "miner"))
