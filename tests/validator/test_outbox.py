"""The lead's outbox: publications a slow bucket held back, on disk beside the window that made them
(the whole path, a kill included, runs in tests/integration/test_storage_faults.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from templar.validator.lead import WindowPublisher


class _Bucket:
    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}

    async def create(self, key: str, data: bytes, timeout: float | None = None) -> None:
        self.objects[key] = data


def _publisher(tmp_path, digest: str = "ab" * 32) -> WindowPublisher:
    node = SimpleNamespace(state_dir=tmp_path, run=SimpleNamespace(digest=digest), bucket=_Bucket(), shadow=False,
                           clock=SimpleNamespace(now=lambda: 0.0))
    return WindowPublisher(node)


def test_the_outbox_holds_what_is_queued_for_this_run_only(tmp_path):
    first = _publisher(tmp_path)
    first.queued.update({"aggregate/12": b"agg", "progress/12": b"prog"})
    first.save_outbox()
    (first.outbox / ".aggregate-13.123.deadbeef.tmp").write_bytes(b"a dead writer's")
    other = _publisher(tmp_path, digest="cd" * 32)  # another run in the same state directory
    other.load_outbox()
    assert other.queued == {}
    again = _publisher(tmp_path)
    again.load_outbox()
    assert again.queued == {"aggregate/12": b"agg", "progress/12": b"prog"}
    assert sorted(p.name for p in again.outbox.iterdir()) == ["aggregate-12", "progress-12"]
    other.queued["peers/3"] = b"hk"
    other.save_outbox()  # the other run's folder stays alone: ours is gone
    assert [p.name for p in (tmp_path / "outbox").iterdir()] == [other.outbox.name]


def test_a_clean_stop_sends_what_was_held_back_and_empties_the_outbox(tmp_path):
    publisher = _publisher(tmp_path)
    publisher.queued["aggregate/12"] = b"agg"
    publisher.save_outbox()
    asyncio.run(publisher.flush_at_stop(12, 10.0))
    assert publisher.node.bucket.objects and not publisher.queued
    assert list(publisher.outbox.iterdir()) == []  # the next start has nothing to say it held back
