"""The chain layer's own vocabulary: plain dataclasses and exceptions, no bittensor types.

Everything above `templar.chain` speaks only these names, so swapping the SDK version (or
the backend: a real node or the embedded SQLite chain) never touches neuron code.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

MAX_COMMITMENT_BYTES = 128
"""Largest raw commitment the Commitments pallet stores in one `Raw` field."""

VALIDATOR_MARK = "v:"
"""Opens the commitment of a hotkey that validates: `v:<bucket locator>`; a miner commits its
locator bare. The role is the hotkey's own word, on chain: only the hotkey can write its
commitment, so no one else can make it a validator or a miner (`is_miner`)."""
VALIDATOR_LOCATOR_BYTES = MAX_COMMITMENT_BYTES - len(VALIDATOR_MARK)
"""The room a validator's locator has in its commitment, after the mark."""


@dataclass(frozen=True)
class Neuron:
    """One registered hotkey on our subnet, as the metagraph reports it.

    `stake` is the neuron's stake weight in TAO-equivalent units (alpha stake valued at the
    subnet's spot price; 1:1 on the embedded chain). `commitment` is the bucket locator the hotkey
    committed, or None when absent or not a well-formed commitment; `validates` says that the
    commitment declares a validator (`VALIDATOR_MARK`).

    The last epoch's Yuma results, as operators read them on finney: `incentive`, `dividends`,
    `consensus`, `trust` and `validator_trust` are fractions in [0, 1]; `emission` is the alpha
    the uid received in that epoch.
    """

    uid: int
    hotkey: str
    coldkey: str
    stake: float
    validator_permit: bool
    last_update: int
    commitment: str | None
    incentive: float = 0.0
    dividends: float = 0.0
    consensus: float = 0.0
    trust: float = 0.0
    validator_trust: float = 0.0
    emission: float = 0.0
    validates: bool = False


@dataclass(frozen=True)
class Commitment:
    """A hotkey's on-chain commitment, read: the bucket locator it names and whether it declares a
    validator (`VALIDATOR_MARK`)."""

    locator: str
    validates: bool = False

    @property
    def text(self) -> str:
        """The raw text it commits: the locator, after the mark for a validator."""
        return (VALIDATOR_MARK if self.validates else "") + self.locator

    def encode(self) -> str:
        """`text`, checked: `ValueError` if the chain would not store it, or if it would not read back as
        this commitment (a locator that begins with the mark would read as a validator's)."""
        if not self.locator or self.locator.startswith(VALIDATOR_MARK):
            raise ValueError(f"a committed locator must be non-empty and not begin with {VALIDATOR_MARK!r}")
        check_commitment(self.text)
        return self.text

    @classmethod
    def read(cls, value: object) -> Commitment | None:
        """A peer's raw committed value, or None when it is not a well-formed commitment (never raises)."""
        text = clean_commitment(value)
        if text is None:
            return None
        validates = text.startswith(VALIDATOR_MARK)
        locator = text[len(VALIDATOR_MARK):] if validates else text
        return cls(locator, validates) if locator else None


@dataclass(frozen=True)
class WeightsSettings:
    """The subnet hyperparameters that decide whether and how a validator's weights land.

    `rate_limit`: blocks between two weight writes of one hotkey (0: none). `commit_reveal`: weights
    are committed timelock-encrypted and revealed by the chain later, so they show on chain only
    after the reveal. `max_weight_fraction`: the largest share one uid may get (the SDK clips).
    """

    rate_limit: int
    commit_reveal: bool
    min_allowed_weights: int
    max_weight_fraction: float
    tempo: int


def next_epoch_block(block: int, netuid: int, tempo: int) -> int | None:
    """The first block at or after `block` at which the chain runs subnet `netuid`'s Yuma epoch
    (subtensor's rule: (b + netuid + 1) % (tempo + 1) == 0, so subnets' epochs are staggered);
    None when `tempo` is 0 (no epochs). Weights count in an epoch only if they landed before it."""
    if tempo <= 0:
        return None
    return block + (-(block + netuid + 1)) % (tempo + 1)


class _Declared(Protocol):
    @property
    def validates(self) -> bool: ...


class _Candidate(_Declared, Protocol):
    @property
    def uid(self) -> int: ...
    @property
    def stake(self) -> float: ...
    @property
    def validator_permit(self) -> bool: ...
    @property
    def commitment(self) -> str | None: ...


C = TypeVar("C", bound=_Candidate)


def is_miner(neuron: _Declared) -> bool:
    """THE rule for who is scored and paid for training: every registered hotkey whose commitment does
    not declare a validator (`VALIDATOR_MARK`).

    Why the hotkey's word and not its stake: the chain grants permits to the most-staked hotkeys,
    and stake is not the hotkey's own to refuse. Anyone can stake onto any hotkey, and on a dTAO
    subnet a miner's own pay is staked to it, so a rule of "a permit and stake make a validator"
    stopped scoring a miner that a stranger staked on, and in time every miner good enough to
    reach the top 64 by its earnings. Declaring is free and undoing it is one commitment, and a
    hotkey gains nothing by declaring falsely: a miner that declares a validator is not paid for
    training, a validator that declares nothing is scored like any miner."""
    return not neuron.validates


def succession_of(neurons: Iterable[C]) -> list[C]:
    """THE rule for who may lead the run, and in which order (docs/design.md §5): the validators able
    to lead (declared in their commitment, a permit, stake above 0, a bucket committed for their
    publications), the most stake first, the lowest uid on ties. From the chain alone, so every
    node derives the same order; the first `lead_slots` of it may publish a window's inputs, each
    in its own slot (`templar.runtime.consensus.succession`). A miner that a stranger stakes into a
    permit never leads: it has not declared a validator."""
    able = [n for n in neurons
            if n.validates and n.validator_permit and n.stake > 0 and n.commitment is not None]
    return sorted(able, key=lambda n: (-n.stake, n.uid))


def lead_of(neurons: Iterable[C]) -> C | None:
    """The first of the succession order (`succession_of`): the validator that leads every window it
    publishes inputs for in time; None without one."""
    order = succession_of(neurons)
    return order[0] if order else None


class ChainError(Exception):
    """A chain operation failed; the message says what and, where known, how to fix it."""


class NotRegistered(ChainError):
    """Our hotkey has no uid on the subnet."""


class Refused(ChainError):
    """The chain (or its transaction pool) refused a write for a reason that can pass: waiting,
    staking or re-reading the subnet may make the same write succeed later.

    `reason` is a stable code for logs, records and metrics; each subclass names one refusal a
    node must handle differently (see `templar.validator.weights`)."""

    reason = "refused"


class RateLimited(Refused):
    """The chain refused a write because it came too soon after the previous one.

    `blocks_to_wait` is what the chain said, or 0 when it did not say (then read the subnet's
    rate limit and our last update to know)."""

    reason = "rate_limited"

    def __init__(self, message: str, blocks_to_wait: int) -> None:
        super().__init__(message)
        self.blocks_to_wait = blocks_to_wait


class PoolRejected(Refused):
    """The node's transaction pool refused the extrinsic before any block saw it: "Priority is
    too low" (another extrinsic of ours with the same nonce is still pending), an outdated or
    future nonce. Nothing landed; the same call usually goes through a block or two later."""

    reason = "priority_too_low"


class CommitRevealPending(Refused):
    """The subnet runs commit-reveal and a commit of ours is still waiting for its reveal (commits
    too fast, too many unrevealed), or the path chosen no longer matches the subnet's setting."""

    reason = "commit_reveal"


class InsufficientStake(Refused):
    """Our hotkey lacks the stake (or the validator permit that stake earns) to set weights."""

    reason = "stake"


class StaleMetagraph(Refused):
    """The write named uids the subnet no longer has as we saw them (a neuron was replaced or the
    subnet shrank since our metagraph read): re-read it and resolve hotkeys to uids again."""

    reason = "stale_metagraph"


class ChainUnavailable(ChainError):
    """The endpoint could not be reached or did not answer within the timeout."""


def check_commitment(text: str) -> bytes:
    """The UTF-8 bytes of a commitment we are about to publish; raises ValueError if unfit.

    A commitment must be non-empty printable ASCII of at most 128 bytes: peers parse it as
    hostile input, and the chain rejects anything longer.
    """
    if not isinstance(text, str) or not text:
        raise ValueError("a commitment must be a non-empty string")
    if not (text.isascii() and text.isprintable()):
        raise ValueError("a commitment must be printable ASCII")
    data = text.encode("ascii")
    if len(data) > MAX_COMMITMENT_BYTES:
        raise ValueError(f"commitment is {len(data)} bytes; the chain stores at most {MAX_COMMITMENT_BYTES}")
    return data


def clean_commitment(value: object) -> str | None:
    """A peer's committed value if it is a well-formed commitment, else None (never raises)."""
    if not isinstance(value, str):
        return None
    try:
        check_commitment(value)
    except ValueError:
        return None
    return value
