"""Fixtures for compression tests: run a test on the C kernels and on the torch paths."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from templar.compress import native


@pytest.fixture(params=["native", "torch"])
def kernel_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run a test on the C kernels (where built) and again on the torch paths."""
    if request.param == "torch":
        with native.disabled():
            yield "torch"
    else:
        yield "native" if native.available() else "torch"
