"""How a torchrun node goes down when a rank dies: one DistError line from rank 0 and a non-zero
exit, whichever of torchrun's SIGTERM and the failed collective reaches rank 0 first."""

from __future__ import annotations

import argparse
import asyncio
import signal
from types import SimpleNamespace

import pytest
from loguru import logger

from templar.core.log import UNCAUGHT
from templar.distributed import launch
from templar.distributed.group import EXIT_RANK_LOST, DistError
from templar.runtime import node as node_module
from templar.runtime.flags import EXIT_UNEXPECTED


class _Compute:
    """`NodeCompute.lead`'s stand-in: no ranks, a follower that is gone when the role ends."""

    def __init__(self, lost: DistError | None) -> None:
        self.lost, self.stopped = lost, False

    async def keepalive(self) -> None:
        await asyncio.Event().wait()

    def stop(self) -> DistError | None:
        self.stopped = True
        return self.lost


def _lead(monkeypatch: pytest.MonkeyPatch, lost: DistError | None) -> tuple[SimpleNamespace, _Compute]:
    compute = _Compute(lost)
    monkeypatch.setattr(launch.NodeCompute, "lead", staticmethod(lambda *a, **k: compute))
    return SimpleNamespace(model=None, hp=None), compute


def test_a_follower_lost_after_a_clean_stop_fails_the_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun SIGTERMs rank 0 when a follower dies; rank 0 finishes its window and saves, but
    the followers cannot be released: that is the node failing, not a clean stop."""
    lost = DistError("rank 0: broadcast_object failed (a rank died or timed out): connection closed")
    node, compute = _lead(monkeypatch, lost)

    async def role_ends_cleanly() -> None:
        async with launch._lead(node, None, "miner", None):
            await asyncio.sleep(0)

    with pytest.raises(DistError) as raised:
        asyncio.run(role_ends_cleanly())
    assert raised.value is lost and compute.stopped and node.compute is compute


def test_the_roles_own_error_wins_over_the_release_and_a_clean_release_is_silent(monkeypatch) -> None:
    node, compute = _lead(monkeypatch, DistError("release failed"))

    async def role_fails() -> None:
        async with launch._lead(node, None, "miner", None):
            raise DistError("the window's collective failed")

    with pytest.raises(DistError, match="the window's collective failed"):
        asyncio.run(role_fails())
    assert compute.stopped

    node, compute = _lead(monkeypatch, None)

    async def role_ends_cleanly() -> None:
        async with launch._lead(node, None, "miner", None):
            await asyncio.sleep(0)

    asyncio.run(role_ends_cleanly())
    assert compute.stopped


LOST = "rank 0: all_reduce failed (a rank died or timed out): connection closed"


@pytest.mark.parametrize(("error", "code", "line"), [
    (DistError(LOST), EXIT_RANK_LOST, LOST),
    (RuntimeError("a bug"), EXIT_UNEXPECTED, UNCAUGHT),
], ids=["node-error", "bug"])
def test_the_error_line_is_written_while_sigterm_is_still_handled(monkeypatch, tmp_path, error, code, line) -> None:
    """`asyncio.run` gives SIGTERM its default action back when it closes the loop; torchrun's
    SIGTERM (within 0.1 s of a dead rank) would then kill rank 0 before a line written after it.
    The line is written before: at that moment SIGTERM is still the loop's. A `NodeError` is one line
    and its code; any other exception (a bug) is logged with its traceback there too, and exits 1."""

    class Node:
        hotkey, uid, hp, state_dir, shadow = "5Fhotkey", 3, SimpleNamespace(windows=None), tmp_path, False

        def install_signal_handlers(self) -> None:
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, lambda: None)

        async def aclose(self) -> None:
            await asyncio.sleep(0)

    async def start_node(args, role):
        return Node()

    async def role(node) -> None:
        raise error

    monkeypatch.setattr(node_module, "start_node", start_node)
    seen: list[tuple[str, object, object]] = []
    sink = logger.add(lambda m: seen.append((m.record["message"], signal.getsignal(signal.SIGTERM),
                                             m.record["exception"])), level="ERROR")
    try:
        exit_code = node_module.run_node(argparse.Namespace(), "miner", role)
    finally:
        logger.remove(sink)
    assert exit_code == code
    assert [m for m, _, _ in seen] == [line]
    assert (seen[0][2] is not None) == (code == EXIT_UNEXPECTED)  # a traceback for the bug alone
    assert seen[0][1] is not signal.SIG_DFL, "the line came after the loop gave SIGTERM back"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # and asyncio.run did give it back
