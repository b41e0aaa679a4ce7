"""Fast evaluation's verdict on one peer's upload in one window, as a type that knows what it means.

Every reader asks a verdict the same two questions: does it cost the peer its μ (paper §3.2: a
failed check multiplies μ by φ), and may the upload earn (be drawn for primary evaluation, be
aggregated)? `Status.passes` and `Status.earns` answer them once, for the validator, the
simulator, the dashboard and the metrics alike. Records and logs carry `FastVerdict.label`, the
status's string (with the wire's reason code for a malformed payload: `malformed:bad_signature`),
and `Status.of_label` reads it back.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Status(StrEnum):
    """What fast evaluation concluded; the value is what records and logs show."""

    OK = "ok"                      # on time, valid, committed, at our step, in sync, its own work
    WARMUP = "warmup"              # valid, marked warm-up (joining or re-syncing): no penalty, earns nothing
    WARMUP_OVERDUE = "warmup_overdue"  # a warm-up past `gauntlet.warmup_overdue_windows` (`ScoreBook.warmup_overdue`)
    NOT_SAMPLED = "not-sampled"    # not drawn for fast evaluation this window (records only)
    UNSERVED = "unserved"          # drawn, but the gather's round ended before its transfer began: no verdict
    # the gather's failures (`templar.comms.GatherStatus`)
    MISSING = "missing"            # no upload for the window, or no usable bucket committed
    EARLY = "early"                # written before the put window opened
    LATE = "late"                  # written after the put window closed
    OVERSIZE = "oversize"          # bigger than the payload cap
    MALFORMED = "malformed"        # refused by the wire's strict reader (`FastVerdict.reason` says why)
    TIMEOUT = "timeout"            # its download budget or the round deadline ran out
    UNREACHABLE = "unreachable"    # bucket unreachable (connection, TLS, auth or server error)
    # fast evaluation's own checks, in the order they run
    UNCOMMITTED = "uncommitted"    # not the payload it committed to before the window's uploads were readable
    REPLAY = "replay"              # its gradient tensors repeat an upload of an earlier window (any hotkey's)
    WRONG_STEP = "wrong_step"      # claims a global_step other than the validator's
    WRONG_BASE = "wrong_base"      # computed from another θ than the run's base for the window (inner.overlap)
    DESYNC = "desync"              # its probes are further than sync_max_steps from the validator's model
    COPY = "copy"                  # shares its work with an earlier upload by another hotkey
    SCALE = "scale"                # its values' norm is far above the window's median

    @property
    def passes(self) -> bool:
        """No penalty: μ is left alone (a warm-up or an unsampled peer did nothing wrong)."""
        return self in _PASSING

    @property
    def judges(self) -> bool:
        """A verdict on the peer's upload: the validator looked at it (or found it absent). Not drawn, or never
        asked for (`unserved`: other transfers held the gather's slots to its deadline), the window says
        nothing of the peer, and the score book records nothing of it (a warm-up episode runs on)."""
        return self not in _UNJUDGED

    @property
    def earns(self) -> bool:
        """The upload may be drawn for primary evaluation and aggregated, so it can be paid."""
        return self is Status.OK

    @property
    def meaning(self) -> str:
        """One line for operators (dashboard tooltips, docs)."""
        return _MEANING[self]

    @classmethod
    def of_label(cls, label: str) -> Status | None:
        """The status of a record's label (`malformed:<reason>` is MALFORMED); None if unknown."""
        try:
            return cls(label.partition(":")[0])
        except ValueError:
            return None


_PASSING = frozenset({Status.OK, Status.WARMUP, Status.NOT_SAMPLED, Status.UNSERVED})
_UNJUDGED = frozenset({Status.NOT_SAMPLED, Status.UNSERVED})

_MEANING = {
    Status.OK: "valid, on time, in sync, not a copy",
    Status.WARMUP: "valid but marked warm-up (a joining or re-syncing miner); never aggregated",
    Status.NOT_SAMPLED: "not drawn for fast evaluation this window",
    Status.UNSERVED: "drawn, but the validator's gather ended before it asked for the upload (other transfers "
                     "held every slot): no verdict, no penalty, not aggregated",
    Status.WARMUP_OVERDUE: "marked warm-up longer after its warm-up began than the run allows "
                           "(gauntlet.warmup_overdue_windows): a warm-up posted for ever keeps no score",
    Status.MISSING: "no upload for the window, or no usable bucket committed",
    Status.EARLY: "uploaded before the put window opened",
    Status.LATE: "uploaded after the put window closed",
    Status.OVERSIZE: "bigger than the payload cap",
    Status.MALFORMED: "rejected by wire validation",
    Status.TIMEOUT: "its download budget or the round deadline ran out",
    Status.UNREACHABLE: "bucket unreachable (connection, TLS, auth or server error)",
    Status.UNCOMMITTED: "not the payload committed before the window's uploads were readable",
    Status.REPLAY: "its gradient repeats, byte for byte, an upload of an earlier window (its own or another's)",
    Status.WRONG_STEP: "claims a global_step other than the validator's",
    Status.WRONG_BASE: "computed from another model than the run's base for the window (the overlap mode: an "
                       "update of window w starts from θ after window w−1, or w−2 when delayed)",
    Status.DESYNC: "sync score above sync_max_steps: its model drifted from the run's",
    Status.COPY: "shares its work with an earlier upload by another hotkey",
    Status.SCALE: "update norm far above the window's median",
}


@dataclass(frozen=True)
class FastVerdict:
    """One peer's fast evaluation in one window."""

    status: Status
    reason: str = ""
    """The wire's stable reason code when `status` is MALFORMED (`templar.wire.errors`), else ''."""
    sync_steps: float | None = None
    copied_from: str | None = None
    """COPY: the hotkey whose earlier upload of the window it shares work with; REPLAY: the hotkey
    whose upload of an earlier window it repeats (itself, for a miner re-posting its own)."""
    pool: tuple[str, ...] = ()
    """The group of hotkeys whose uploads share work with this one (itself included, earliest
    first; `templar.gauntlet.find_pools`); empty when it shares with nobody."""

    @property
    def passed(self) -> bool:
        return self.status.passes

    @property
    def label(self) -> str:
        """What records and logs show: the status, with the reason of a malformed payload."""
        return f"{self.status.value}:{self.reason}" if self.reason else self.status.value


def label_meaning(label: str) -> str:
    """What a record's status label means, for operators ('unknown status' for a label this
    version does not know)."""
    status = Status.of_label(label)
    if status is None:
        return "unknown status"
    if status is Status.MALFORMED and ":" in label:
        return f"{status.meaning} ({label.partition(':')[2]})"
    return status.meaning
