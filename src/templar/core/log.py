"""Structured logging: one line per event, always carrying window, hotkey and phase.

Use `logger.bind(window=w, hotkey=hk, phase="gather")` (or `context(...)`) so every line says
where in the run it happened. `setup_logging(json_lines=True)` writes machine-readable JSON lines
for operators; the default is a compact human format.
"""

from __future__ import annotations

import sys
from pathlib import Path

from loguru import logger

_HUMAN = (
    "<green>{time:HH:mm:ss.SSS}</green> <level>{level: <7}</level> "
    "<cyan>w={extra[window]}</cyan> <magenta>{extra[phase]: <9}</magenta> "
    "<blue>{extra[hotkey]}</blue> {message}"
)
_PLAIN = "{time:YYYY-MM-DD HH:mm:ss.SSS} {level: <7} w={extra[window]} {extra[phase]: <9} {extra[hotkey]} {message}"


def short(hotkey: str) -> str:
    """The first 8 characters of an ss58 address: enough to tell peers apart in logs."""
    return hotkey[:8] if hotkey else "-"


def setup_logging(
    *, debug: bool = False, json_lines: bool = False, logfile: Path | None = None, hotkey: str = ""
) -> None:
    """Configure loguru once per process. Defaults fill the structured fields."""
    logger.remove()
    logger.configure(extra={"window": "-", "phase": "-", "hotkey": short(hotkey)})
    level = "DEBUG" if debug else "INFO"
    if json_lines:
        logger.add(sys.stderr, level=level, serialize=True)
    else:
        logger.add(sys.stderr, level=level, format=_HUMAN, colorize=sys.stderr.isatty())
    if logfile is not None:
        logfile.parent.mkdir(parents=True, exist_ok=True)
        logger.add(logfile, level="DEBUG", format=_PLAIN if not json_lines else "{message}",
                   serialize=json_lines, enqueue=False)


def context(*, window: int | str = "-", phase: str = "-", hotkey: str | None = None):
    """A bound logger for one window and phase."""
    fields: dict[str, object] = {"window": window, "phase": phase}
    if hotkey is not None:
        fields["hotkey"] = short(hotkey)
    return logger.bind(**fields)
