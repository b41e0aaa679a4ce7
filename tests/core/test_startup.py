"""`libraries_loading`: a process's imports with the cyclic garbage collector paused, then frozen."""

from __future__ import annotations

import gc

from templar.core.startup import libraries_loading


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
