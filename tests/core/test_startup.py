"""A process's start-up: its imports with the cyclic garbage collector paused, then frozen
(`libraries_loading`), and room for its open files (`raise_open_files_limit`)."""

from __future__ import annotations

import gc

import pytest

from templar.core.startup import libraries_loading, raise_open_files_limit


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
