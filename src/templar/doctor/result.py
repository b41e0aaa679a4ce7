"""What a check says: a status, one line for the operator, the fix, and the numbers behind it."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from templar.core.log import printable


class Status(StrEnum):
    OK = "ok"
    WARNING = "warning"    # the node will run, but something will cost you (time, money, pay)
    FAILED = "failed"      # the node will fail, now or in its first windows
    SKIPPED = "skipped"    # could not be checked: an earlier check failed, or it does not apply


@dataclass(frozen=True)
class CheckResult:
    """One check's verdict. `summary` is one line; `fix` says what to do (warnings and failures)."""

    name: str
    status: Status
    summary: str
    fix: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": str(self.status), "summary": self.summary, "fix": self.fix,
                "data": self.data}


def ok(name: str, summary: str, **data: Any) -> CheckResult:
    return CheckResult(name, Status.OK, summary, data=data)


def warning(name: str, summary: str, fix: str, **data: Any) -> CheckResult:
    return CheckResult(name, Status.WARNING, summary, fix, data=data)


def failed(name: str, summary: str, fix: str, **data: Any) -> CheckResult:
    return CheckResult(name, Status.FAILED, summary, fix, data=data)


def skipped(name: str, why: str) -> CheckResult:
    return CheckResult(name, Status.SKIPPED, why)


def format_results(results: list[CheckResult]) -> str:
    """One line per check (`status  name  summary`), the fix indented beneath, then a total.

    Summaries quote what peers and servers said (the lead's run record, a bucket's error, an
    exception's text), so each is made `printable`: a `\\r`, a newline or an escape sequence in them
    could otherwise rewrite a `failed` line as `ok` on the operator's terminal."""
    width = max((len(r.name) for r in results), default=8)
    lines = []
    for r in results:
        lines.append(f"{r.status:<8} {r.name:<{width}}  {printable(r.summary)}")
        if r.fix and r.status in (Status.WARNING, Status.FAILED):
            lines.append(f"{'':<8} {'':<{width}}  fix: {printable(r.fix)}")
    counts = {s: sum(r.status == s for r in results) for s in Status}
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items() if n) or "nothing checked")
    return "\n".join(lines)
