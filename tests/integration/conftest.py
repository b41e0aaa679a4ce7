"""The integration tests' nodes share this process, as an in-process localnet's do, and read payloads as
they do: each distinct payload decoded once for all of them (`templar.wire.shared_reads`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _nodes_share_their_reads() -> Iterator[None]:
    from templar.wire.shared_reads import sharing_reads

    with sharing_reads():
        yield
