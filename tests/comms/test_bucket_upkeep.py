"""What nodes delete from their own buckets, on a real local bucket: a miner's gradients and
commitments past the kept windows (each window, and what a stop left, found when it starts), and the
lead's history past what any node replays, peer lists included but the one that may still be in effect."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

from templar.comms.keys import (
    aggregate_key,
    checkpoint_manifest_key,
    commit_key,
    gradient_key,
    inputs_key,
    peers_index_key,
    peers_key,
    progress_key,
)
from templar.core.config import load_hparams
from templar.miner import upkeep
from templar.miner.upkeep import DELETES_PER_STEP, StaleObjects, kept_windows
from templar.storage import LocalBucket, StorageError
from templar.validator.lead import delete_history_before


async def _listed(bucket: LocalBucket) -> set[str]:
    return {obj.key for obj in await bucket.list("")}


def _keys(bucket: LocalBucket) -> set[str]:
    return asyncio.run(_listed(bucket))


def _fill(bucket: LocalBucket, keys: list[str]) -> None:
    async def body() -> None:
        for key in keys:
            await bucket.put(key, b"x")

    asyncio.run(body())


def test_a_miner_keeps_its_newest_windows_and_clears_what_a_stop_left(tmp_path: Path) -> None:
    hp = load_hparams("tiny")
    kept = kept_windows(hp)
    bucket = LocalBucket(tmp_path / "miner", create=True)
    left = [w for w in range(0, 200) if w % 7]  # a long run with gaps, then a stop
    others = [peers_index_key(), "v4/gradient/notes.txt", "v4/commit/index.json"]  # never a window's object
    _fill(bucket, [key_of(w) for w in left for key_of in (gradient_key, commit_key)] + others)
    upkeep = StaleObjects(hp)
    start = 300  # the miner comes back 100 windows later
    asyncio.run(upkeep.sweep(bucket, start))
    assert len(upkeep.pending) == 2 * len(left)  # every one is older than the kept range at start

    async def steps(first: int, last: int) -> None:
        for window in range(first, last + 1):
            before = len(await _listed(bucket))
            await upkeep.after_step(bucket, window)
            assert before - len(await _listed(bucket)) <= DELETES_PER_STEP  # a backlog costs no window more

    asyncio.run(steps(start, start + 2 * len(left) // DELETES_PER_STEP + 1))
    assert _keys(bucket) == set(others) and not upkeep.pending
    now = start + 2 * len(left) // DELETES_PER_STEP + 1
    # from here on, each window's own objects, and exactly the window that falls out of the range
    _fill(bucket, [key_of(w) for w in range(now + 1, now + 2 * kept) for key_of in (gradient_key, commit_key)])
    asyncio.run(steps(now + 1, now + 2 * kept - 1))
    windows = range(now + kept, now + 2 * kept)
    assert _keys(bucket) == set(others) | {key_of(w) for w in windows for key_of in (gradient_key, commit_key)}


def test_a_jump_is_swept_again_and_a_failing_bucket_never_stops_the_window(tmp_path: Path) -> None:
    hp = load_hparams("tiny")
    kept = kept_windows(hp)
    bucket = LocalBucket(tmp_path / "miner", create=True)
    upkeep = StaleObjects(hp)
    asyncio.run(upkeep.sweep(bucket, 100))
    _fill(bucket, [gradient_key(w) for w in range(100, 110)])  # uploaded, then a re-sync jumps far ahead
    asyncio.run(upkeep.after_step(bucket, 110 + 3 * kept))
    assert not any(k.startswith("v4/gradient/") for k in _keys(bucket))

    class Refusing(LocalBucket):
        async def list(self, prefix: str = "", **_: object) -> list:
            raise StorageError("listing refused")

        async def delete(self, key: str, **_: object) -> None:
            raise StorageError("delete refused")

    refusing = Refusing(tmp_path / "refusing", create=True)
    upkeep = StaleObjects(hp)
    asyncio.run(upkeep.sweep(refusing, 500))  # logged, not raised
    for window in range(500, 503):
        asyncio.run(upkeep.after_step(refusing, window))
    assert upkeep.clean_before == 502 - kept + 1


def test_a_bucket_down_for_a_while_loses_nothing_and_one_down_for_good_costs_little(tmp_path: Path) -> None:
    """A failed LIST is asked again, and a failed DELETE tried again, after 1, 2, 4, ... windows: what a
    miner left before a stop, and the windows that fell out meanwhile, all go once the bucket answers.
    A bucket that never does is asked a LIST a handful of times and each DELETE `DELETE_ATTEMPTS` times."""
    hp = load_hparams("tiny")
    kept = kept_windows(hp)

    class Down(LocalBucket):
        down, lists = True, 0
        deletes: Counter

        async def list(self, prefix: str = "", **kwargs: object) -> list:
            self.lists += 1
            if self.down:
                raise StorageError("503 Slow Down")
            return await super().list(prefix, **kwargs)

        async def delete(self, key: str, **kwargs: object) -> None:
            self.deletes = getattr(self, "deletes", Counter())
            self.deletes[key] += 1
            if self.down:
                raise StorageError("503 Slow Down")
            await super().delete(key, **kwargs)

    bucket = Down(tmp_path / "flaky", create=True)
    objects = LocalBucket(tmp_path / "flaky")  # what the bucket holds, read past its outage
    left = [key_of(w) for w in range(0, 40) for key_of in (gradient_key, commit_key)]  # before a stop
    _fill(bucket, left)
    stale = StaleObjects(hp)
    asyncio.run(stale.sweep(bucket, 100))  # the start's LIST fails

    async def run(first: int, last: int, fill: bool) -> None:
        for window in range(first, last + 1):
            if fill:
                for key_of in (gradient_key, commit_key):
                    await bucket.put(key_of(window), b"x")
            await stale.after_step(bucket, window)

    asyncio.run(run(100, 110, fill=True))
    assert set(left) <= _keys(objects)  # nothing went while the bucket was down
    bucket.down = False
    asyncio.run(run(111, 130, fill=True))  # a retried LIST finds the stop's backlog; failed deletes go again
    assert _keys(objects) == {key_of(w) for w in range(130 - kept + 1, 131) for key_of in (gradient_key, commit_key)}
    assert not stale.pending and not stale.failures and not stale.retry_at

    gone = Down(tmp_path / "gone", create=True)
    stale = StaleObjects(hp)
    asyncio.run(stale.sweep(gone, 1000))
    for window in range(1000, 1301):
        asyncio.run(stale.after_step(gone, window))
    # listed at 1000, 1001, 1003, 1007, ..., 1127, then every 64 windows: 2 LISTs each
    assert gone.lists == 2 * (8 + len(range(1127 + 64, 1301, 64)))
    first_out = [key_of(1000 - kept + 1) for key_of in (gradient_key, commit_key)]
    assert all(gone.deletes[key] == upkeep.DELETE_ATTEMPTS for key in first_out)  # then left to a lifecycle rule
    assert max(gone.deletes.values()) == upkeep.DELETE_ATTEMPTS
    patience = 2 ** (upkeep.DELETE_ATTEMPTS - 1) - 1  # windows from a key's first try to its last: 63
    assert len(stale.failures) <= 2 * patience and not stale.pending  # nothing piles up


def test_a_stalling_bucket_holds_the_step_no_longer_than_its_time(tmp_path: Path, monkeypatch) -> None:
    """The next window's upload waits behind the step: deletes that stall (a bucket that accepts the
    connection and never answers) end at `STEP_SECONDS`, and what they left undone is asked again."""
    hp = load_hparams("tiny")
    monkeypatch.setattr(upkeep, "STEP_SECONDS", 0.2)

    class Stalling(LocalBucket):
        async def delete(self, key: str, **_: object) -> None:
            await asyncio.sleep(3600)

    bucket = Stalling(tmp_path / "stalling", create=True)
    stale = StaleObjects(hp)
    asyncio.run(stale.sweep(bucket, 100))
    stale.pending = [gradient_key(w) for w in range(10)]

    asyncio.run(asyncio.wait_for(stale.after_step(bucket, 100), 30))  # without its time, an hour
    assert stale.pending[:10] == [gradient_key(w) for w in range(10)]  # undone, first in line again


def test_the_leads_history_goes_but_the_peer_list_still_in_effect(tmp_path: Path) -> None:
    bucket = LocalBucket(tmp_path / "lead", create=True)
    per_window = (aggregate_key, inputs_key, progress_key)
    lists = [3, 9, 15, 21, 40, 46]  # the lead named a new list in these windows only
    _fill(bucket, [key_of(w) for w in range(0, 50) for key_of in per_window]
          + [peers_key(w) for w in lists] + [peers_index_key(), checkpoint_manifest_key(10)])
    asyncio.run(delete_history_before(bucket, 30))
    keys = _keys(bucket)
    assert {key_of(w) for w in range(30, 50) for key_of in per_window} <= keys
    assert not any(key_of(w) in keys for w in range(0, 30) for key_of in per_window)
    # windows 30..39 are still answered by the list of window 21: it stays, the older ones go
    assert {k for k in keys if k.startswith("v4/peers/")} == {peers_key(21), peers_key(40), peers_key(46),
                                                              peers_index_key()}
    assert checkpoint_manifest_key(10) in keys  # checkpoints have their own cleanup


class _Counting(LocalBucket):
    lists = 0

    async def list(self, prefix: str = "", **kwargs: object) -> list:
        self.lists += 1
        return await super().list(prefix, **kwargs)


def test_a_former_lead_clears_its_history_once_it_follows_and_then_lists_no_more(tmp_path: Path) -> None:
    """A validator that led windows and follows now (or was restarted) clears its own history as the lead
    does, at the checkpoints' windows it follows, until the last window it led is out of the kept range;
    after that its cleanup lists nothing until it leads again."""
    from types import SimpleNamespace

    from templar.runtime.consensus.windows import retained_windows
    from templar.validator.lead import CheckpointPublisher
    from templar.validator.roles import FollowerRole

    hp = load_hparams("tiny")
    kept, every = retained_windows(hp), hp.windows.checkpoint_frequency
    bucket = _Counting(tmp_path / "former-lead", create=True)
    per_window = (aggregate_key, inputs_key, progress_key)
    _fill(bucket, [key_of(w) for w in range(0, 50) for key_of in per_window] + [peers_key(w) for w in (0, 20, 40)]
          + [peers_index_key()])
    checkpoints = CheckpointPublisher(SimpleNamespace(hp=hp, bucket=bucket))
    follower = FollowerRole(SimpleNamespace(hp=hp, checkpoints=checkpoints))

    async def follow(window: int) -> None:
        await follower.checkpoint(SimpleNamespace(window=window))
        await checkpoints.wait()

    async def scenario() -> None:
        await follow(every + 1)  # not a checkpoint's window: nothing
        assert bucket.lists == 0
        await follow(every * (1 + 49 // every))  # restarted: what it led before is unknown, so it looks
        assert bucket.lists == 4 and not checkpoints.history_clean  # and finds windows still in the kept range
        assert checkpoints.last_led == 49
        first_clear = every * (1 + (49 + kept) // every)
        await follow(first_clear)
        assert checkpoints.history_clean and bucket.lists == 8
        await follow(first_clear + every)
        assert bucket.lists == 8  # nothing of ours left: no LIST
        checkpoints.led(first_clear + every + 1)  # it leads again, then follows
        await follow(first_clear + 2 * every)
        assert bucket.lists == 12

    asyncio.run(scenario())
    assert {k for k in _keys(bucket) if not k.startswith("v4/peers/")} == set()
    assert {k for k in _keys(bucket) if k.startswith("v4/peers/")} == {peers_key(40), peers_index_key()}


def test_a_checkpoint_write_killed_midway_leaves_no_copy_of_the_model_behind(tmp_path):
    """`kill -9` while the lead writes its local checkpoint leaves `atomic_write`'s temporary file (the
    model's size: 4.8 GB at 1.2B) that the next checkpoint's cleanup did not match, so each such crash
    kept one for good. The next checkpoint removes it with the last checkpoint's file."""
    import asyncio
    from types import SimpleNamespace

    from templar.validator.lead import CheckpointPublisher

    folder = tmp_path / "checkpoint"
    folder.mkdir()
    for name in ("4-model.safetensors", ".5-model.safetensors.2451.3096dfc7.tmp"):
        (folder / name).write_bytes(b"x" * 64)
    written = []
    node = SimpleNamespace(state_dir=tmp_path, hp=load_hparams("tiny"),
                           compute=SimpleNamespace(write_model_file=lambda path: written.append(path.name)))
    publisher = CheckpointPublisher(node)
    publisher._upload = lambda *args: asyncio.sleep(0)  # the upload is not this test's
    asyncio.run(publisher.publish(6, 3))
    assert written == ["6-model.safetensors"] and list(folder.iterdir()) == []
