"""Structured logging: one line per event, always carrying window, hotkey and phase.

Use `logger.bind(window=w, hotkey=hk, phase="gather")` (or `context(...)`) so every line says
where in the run it happened. `setup_logging(json_lines=True)` writes machine-readable JSON lines
for operators; the default is a compact human format.

Every message is made `printable` before any sink sees it: peers choose much of what a node logs
(a malformed payload's tensor names, a storage server's words, a lead's records), and a raw newline
in it would forge a log line, an escape sequence would drive the terminal of whoever reads the log.
A logged exception's traceback is written the same way (`printable_traceback`): its messages can
quote a peer as a log line can. So is one that no code caught: `setup_logging` routes what Python and
asyncio would print themselves (an exception out of `main` or a thread, one Python ignored, a task's
exception nobody retrieved) through the same sinks.
"""

from __future__ import annotations

import logging
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from loguru import logger

_HUMAN = (
    "<green>{time:HH:mm:ss.SSS}</green> <level>{level: <7}</level> "
    "<cyan>w={extra[window]}</cyan> <magenta>{extra[phase]: <9}</magenta> "
    "<blue>{extra[hotkey]}</blue> {message}"
)
UNCAUGHT = "stopped on an exception no code caught"
"""What a node logs, with the traceback, when an exception reached its top: a bug (exit code 1)."""
_PLAIN = "{time:YYYY-MM-DD HH:mm:ss.SSS} {level: <7} w={extra[window]} {extra[phase]: <9} {extra[hotkey]} {message}"


def short(hotkey: str) -> str:
    """The first 8 characters of an ss58 address: enough to tell peers apart in logs."""
    return hotkey[:8] if hotkey else "-"


def printable(text: str) -> str:
    """`text` with every character that is not printable escaped as Python writes it (`\\n`, `\\x1b`,
    `\\u202e`): one line, nothing a terminal acts on (ESC/OSC sequences, `\\r`, bidi overrides).

    For any peer-chosen string bound for a log or a terminal; printable text passes unchanged."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def peer_text(text: object, limit: int = 200) -> str:
    """Text a peer or its server chose (an error message, a reason) as one short line for a log or a
    message: whitespace runs made one space, `printable`, cut at `limit` characters (marked "…")."""
    flat = printable(" ".join(str(text).split()))
    return flat if len(flat) <= limit else flat[:limit] + "…"


def printable_traceback(exc_type: type[BaseException] | None, value: BaseException | None,
                        tb: TracebackType | None) -> str:
    """A traceback as Python prints it (chained exceptions and notes included), with each exception's
    message and notes `printable` and every line of the text escaped: a newline inside a message is
    `\\n`, so a peer's words inside an exception (a payload's tensor name, a server's reply) can neither
    forge a log line nor drive a terminal. The frames' lines are the code's own."""
    if exc_type is None:
        return ""
    top = traceback.TracebackException(exc_type, value, tb)
    pending, seen = [top], set()
    while pending:  # the chain of causes, contexts and groups, each once
        te = pending.pop()
        if id(te) in seen:
            continue
        seen.add(id(te))
        te._str = printable(te._str)  # the message `format_exception_only` writes (CPython 3.11's attribute)
        notes = getattr(te, "__notes__", None)
        if isinstance(notes, list):
            te.__notes__ = [printable(str(note)) for note in notes]
        pending.extend(t for t in (te.__cause__, te.__context__, *(getattr(te, "exceptions", None) or [])) if t)
    return "\n".join(printable(line) for line in "".join(top.format()).rstrip("\n").split("\n"))


def _printable_message(record: Any) -> None:
    """The loguru patcher of `setup_logging`: no message, and no traceback, reaches a sink with a control
    character. The traceback goes as `extra[traceback]`, which `_format` writes in place of loguru's own."""
    record["message"] = printable(record["message"])
    if exception := record["exception"]:
        record["extra"]["traceback"] = printable_traceback(*exception)


def _format(template: str) -> Callable[[Any], str]:
    """A sink's format: `template`, then the escaped traceback of a logged exception. A callable format keeps
    loguru from appending its own rendering of the exception (`{exception}`: the messages unescaped)."""

    def render(record: Any) -> str:
        return template + ("\n{extra[traceback]}" if record["exception"] else "") + "\n"

    return render


def _log_uncaught(exc_type: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    """`sys.excepthook`: an exception out of the main thread is a bug's, and its traceback is logged like any
    other (escaped, in every sink) rather than printed raw by Python. Ctrl-C keeps Python's own words."""
    if issubclass(exc_type, KeyboardInterrupt):
        sys.__excepthook__(exc_type, value, tb)
        return
    logger.opt(exception=(exc_type, value, tb)).critical(UNCAUGHT)


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    """`threading.excepthook`: as `_log_uncaught`, for a thread that ended on an exception."""
    if issubclass(args.exc_type, SystemExit):  # what Python's own hook says nothing of either
        return
    name = args.thread.name if args.thread is not None else "?"
    logger.opt(exception=(args.exc_type, args.exc_value, args.exc_traceback)).error(
        f"thread {name} stopped on an exception no code caught")


def _log_unraisable(args: Any) -> None:
    """`sys.unraisablehook`: an exception Python could only ignore (raised in a finaliser, a generator's
    close), said once as a warning with its traceback."""
    what = args.err_msg or "exception ignored in"
    where = f": {args.object!r}" if args.object is not None else ""
    logger.opt(exception=(args.exc_type, args.exc_value, args.exc_traceback)).warning(f"{what}{where}")


class _StdlibToLoguru(logging.Handler):
    """The `asyncio` logger's records into loguru's sinks: asyncio reports a task's exception nobody
    retrieved, or a callback that raised, through the standard `logging`, whose last-resort handler wrote
    the message and traceback raw to stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            level: str | int = logger.level(record.levelname).name
        except ValueError:
            level = record.levelno
        exc_info = record.exc_info if record.exc_info and record.exc_info[0] is not None else None
        logger.opt(exception=exc_info).log(level, " | ".join(record.getMessage().splitlines()))  # asyncio's own lines


def _route_uncaught_exceptions() -> None:
    """What Python and asyncio print on their own goes through loguru (`printable_traceback`) instead. A hook
    another program installed (a test runner's, a debugger's) is left in place: it reports these itself."""
    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = _log_uncaught
    if threading.excepthook is threading.__excepthook__:
        threading.excepthook = _log_uncaught_in_thread
    if sys.unraisablehook is sys.__unraisablehook__:
        sys.unraisablehook = _log_unraisable
    stdlib = logging.getLogger("asyncio")
    if not any(isinstance(handler, _StdlibToLoguru) for handler in stdlib.handlers):
        stdlib.addHandler(_StdlibToLoguru())
    stdlib.propagate = False


def setup_logging(
    *, debug: bool = False, json_lines: bool = False, logfile: Path | None = None, hotkey: str = ""
) -> None:
    """Configure loguru once per process. Defaults fill the structured fields. Exceptions no code caught are
    logged through the same sinks (`_route_uncaught_exceptions`)."""
    logger.remove()
    logger.configure(extra={"window": "-", "phase": "-", "hotkey": short(hotkey)}, patcher=_printable_message)
    level = "DEBUG" if debug else "INFO"
    # diagnose=False: loguru's default writes every variable of a logged traceback's frames beside it,
    # a write key's secret or a peer's bytes among them, into logs operators paste into issues.
    if json_lines:
        logger.add(sys.stderr, level=level, format=_format(_PLAIN), serialize=True, diagnose=False)
    else:
        logger.add(sys.stderr, level=level, format=_format(_HUMAN), colorize=sys.stderr.isatty(), diagnose=False)
    if logfile is not None:
        logfile.parent.mkdir(parents=True, exist_ok=True)
        logger.add(logfile, level="DEBUG", format=_format(_PLAIN if not json_lines else "{message}"),
                   serialize=json_lines, enqueue=False, diagnose=False)
    _route_uncaught_exceptions()


def context(*, window: int | str = "-", phase: str = "-", hotkey: str | None = None):
    """A bound logger for one window and phase."""
    fields: dict[str, object] = {"window": window, "phase": phase}
    if hotkey is not None:
        fields["hotkey"] = short(hotkey)
    return logger.bind(**fields)
