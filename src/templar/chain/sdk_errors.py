"""The bittensor SDK's exceptions as the project's (`templar.chain.types`): which refusal needs
which handling is decided here, once, by the chain's error name first and its code second."""

from __future__ import annotations

import re
from typing import Any

import bittensor as bt
from bittensor_core import KeyfileError

from templar.chain.types import (
    ChainError,
    ChainUnavailable,
    CommitRevealPending,
    InsufficientStake,
    NotRegistered,
    PoolRejected,
    RateLimited,
    StaleMetagraph,
)

_WAIT_RE = re.compile(r"[Rr]etry in ~?(\d+) blocks")


def translate(what: str, exc: BaseException, endpoint: str) -> BaseException:
    """Map an SDK/transport exception to the project's; unknown exceptions (bugs) pass through."""
    if isinstance(exc, ChainError):
        return exc
    if isinstance(exc, FileNotFoundError | PermissionError | IsADirectoryError):
        return ChainError(f"{what}: wallet key file problem: {exc}")
    if isinstance(exc, bt.RpcConnectionError | bt.ConnectionNotReady | OSError):
        return ChainUnavailable(f"{what}: cannot reach {endpoint}: {exc}")
    if isinstance(exc, bt.ChainError):
        return _from_sdk_error(what, exc)
    if isinstance(exc, bt.BittensorError | KeyfileError):
        return ChainError(f"{what}: {exc}")
    return exc


_POOL_REJECTIONS = frozenset({"PriorityTooLow", "Stale", "Future", "AlreadyImported", "Dropped", "Usurped"})
"""Refusals of the node's transaction pool: nothing landed, and the same call usually passes a
block or two later. The SDK classifies "Priority is too low" as RATE_LIMITED; it is not one."""
_COMMIT_REVEAL = frozenset({
    "CommittingWeightsTooFast", "TooManyUnrevealedCommits", "CommitQueueFull", "CommitRevealEnabled",
    "CommitRevealDisabled", "RevealTooEarly", "ExpiredWeightCommit", "InvalidRevealRound",
    "NoWeightsCommitFound", "IncorrectCommitRevealVersion",
})
_STAKE = frozenset({"NotEnoughStakeToSetWeights", "StakeAmountTooLow", "NeuronNoValidatorPermit"})
_STALE_UIDS = frozenset({"UidVecContainInvalidOne", "UidsLengthExceedUidsInSubNet"})


def _from_sdk_error(what: str, exc: bt.ChainError) -> ChainError:
    """The project's exception for an SDK `ChainError`, by the chain's error *name* first (the
    semantic codes lump refusals that need different handling together), then by code."""
    detail = f"{what}: {exc.message}" + (f" [{exc.name}]" if exc.name else "")
    if exc.code == bt.ErrorCode.NOT_REGISTERED or exc.name in (
        "HotKeyNotRegisteredInSubNet",
        "AccountNotAllowedCommit",
    ):
        return NotRegistered(detail)
    if exc.name in _POOL_REJECTIONS or (not exc.name and "priority is too low" in exc.message.lower()):
        return PoolRejected(detail)
    if exc.name in _COMMIT_REVEAL:
        return CommitRevealPending(detail)
    if exc.name in _STAKE:
        return InsufficientStake(f"{detail} (hint: {exc.remediation})")
    if exc.name in _STALE_UIDS:
        return StaleMetagraph(detail)
    if exc.code == bt.ErrorCode.RATE_LIMITED:
        match = _WAIT_RE.search(exc.message)
        return RateLimited(detail, int(match.group(1)) if match else 0)
    return ChainError(f"{detail} (hint: {exc.remediation})")


def check_result(what: str, result: Any, endpoint: str) -> Any:
    """Raise the translated error of a failed `ExtrinsicResult`; return it otherwise."""
    if not result.success:
        raise translate(what, result.error or bt.ChainError(result.message or "extrinsic failed"), endpoint)
    return result
