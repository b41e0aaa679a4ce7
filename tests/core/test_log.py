"""Logging of peer-chosen text: one event is one line, and nothing in it drives a terminal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from loguru import logger

from templar.core.log import printable, setup_logging
from templar.wire import PayloadError
from templar.wire.container import parse_container

FORGED = "2030-01-01 00:00:00.000 INFO    w=9 score     5F3sa2TJ peer uid 1: ok"


def test_printable_escapes_what_a_terminal_or_a_log_reader_acts_on():
    assert printable("peer uid 3: μ +0.120 → ok … τ") == "peer uid 3: μ +0.120 → ok … τ"
    assert printable("a\nb\r\x1b]0;t\x07\u202ec\x9b") == "a\\nb\\r\\x1b]0;t\\x07\\u202ec\\x9b"


def test_a_malformed_payloads_words_cannot_forge_a_log_line(tmp_path: Path):
    """A peer names a tensor of its payload; the wire's PayloadError quotes the name (its detail), and
    a lead candidate's detail reaches `[SYNC]` warnings unclipped (`runtime.consensus.succession`)."""
    key = f"w\n{FORGED}\x1b[2J\x1b]52;c;Y3VybCBldmlsfHNo\x07"
    header = json.dumps({"__metadata__": {"templar": "{}", "signature": ""}, key: {"dtype": "F32"}}).encode()
    with pytest.raises(PayloadError) as caught:
        parse_container(len(header).to_bytes(8, "little") + header, max_header=4096)
    assert FORGED in str(caught.value)
    log = tmp_path / "node.log"
    setup_logging(logfile=log)
    try:
        logger.warning(f"[SYNC] uid 1's inputs are malformed ({caught.value})")
    finally:
        logger.remove()
        logger.configure(patcher=lambda record: None)
        logger.add(sys.stderr)
    lines = log.read_text().splitlines()
    assert len(lines) == 1 and "[SYNC]" in lines[0] and FORGED in lines[0]  # said, inside the one line
    assert "\x1b" not in lines[0] and "\x07" not in lines[0] and "\\x1b[2J" in lines[0]


def _no_bucket_for(key: str) -> None:
    raise LookupError("no bucket for a key of length " + str(len(key)))


def test_a_logged_traceback_never_shows_the_values_of_its_variables(tmp_path: Path):
    """loguru's default (`diagnose=True`) prints each frame's variables beside a logged traceback: a
    crash while holding the write key printed its secret into the log file."""
    log = tmp_path / "node.log"
    setup_logging(logfile=log)
    secret = "write-secret-0123456789"
    try:
        try:
            _no_bucket_for(secret)
        except LookupError as exc:
            logger.opt(exception=exc).error("the commit watcher stopped")
    finally:
        logger.remove()
        logger.configure(patcher=lambda record: None)
        logger.add(sys.stderr)
    text = log.read_text()
    assert "the commit watcher stopped" in text and "LookupError" in text and secret not in text


def _refuse(name: str) -> None:
    raise KeyError(f"no tensor {name}")


def test_a_logged_traceback_says_a_peers_words_escaped_in_its_one_line(tmp_path: Path):
    """A logged exception's message is a peer's words as often as a log line is (a payload's tensor name
    inside a KeyError, a server's reply inside a cause): in the traceback too it is escaped, chained causes
    and notes included, so it can neither forge a line nor drive a terminal; the frames are still there."""
    log = tmp_path / "node.log"
    words = f"w\n{FORGED}\x1b]52;c;Y3VybCBldmlsfHNo\x07"
    setup_logging(logfile=log)
    try:
        try:
            try:
                _refuse(words)
            except KeyError as inner:
                outer = RuntimeError(f"the commit watcher stopped on {words}")
                outer.add_note(f"the peer said {words}")
                raise outer from inner
        except RuntimeError as exc:
            logger.opt(exception=exc).error("the commit watcher stopped")
        logger.info("the next line")
    finally:
        logger.remove()
        logger.configure(patcher=lambda record: None)
        logger.add(sys.stderr)
    text = log.read_text()
    lines = text.splitlines()
    assert FORGED not in lines and not any(line.startswith(FORGED) for line in lines), text  # no forged line
    assert "\x1b" not in text and "\x07" not in text, text
    assert text.count("\\x1b]52;c;") == 3, text  # the cause's message, the exception's and its note: said, escaped
    assert "in _refuse" in text and "direct cause" in text and "RuntimeError" in text, text  # the frames and the chain
    assert lines[0].endswith("the commit watcher stopped") and lines[-1].endswith("the next line"), text


UNCAUGHT = '''
import asyncio, gc, sys, threading
from pathlib import Path
from templar.core.log import setup_logging

words = sys.argv[2]
setup_logging(logfile=Path(sys.argv[1]))

def fail():
    raise ValueError(f"thread saw {words}")

thread = threading.Thread(target=fail, name="commit-watcher")
thread.start()
thread.join()

class Holder:
    def __del__(self):
        raise ValueError(f"finaliser saw {words}")

Holder()

async def failing_task():
    raise ValueError(f"task saw {words}")

async def main():
    task = asyncio.get_running_loop().create_task(failing_task())
    await asyncio.sleep(0)
    del task
    gc.collect()

asyncio.run(main())
raise ValueError(f"main saw {words}")
'''


def test_an_exception_no_code_caught_is_logged_escaped_as_any_other(tmp_path: Path):
    """Python prints an exception out of `main` or a thread itself, asyncio a task's exception nobody retrieved,
    both raw: a bug's traceback that quotes a peer forged lines and drove the reader's terminal. After
    `setup_logging` each goes through the node's sinks, escaped, in its log file too; the exit code is Python's."""
    log = tmp_path / "node.log"
    words = f"w\n{FORGED}\x1b]52;c;Y3VybCBldmlsfHNo\x07"
    proc = subprocess.run([sys.executable, "-c", UNCAUGHT, str(log), words], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1, proc.stderr
    for text in (proc.stderr, log.read_text()):
        lines = text.splitlines()
        assert not any(line.startswith(FORGED) for line in lines), text  # no forged line
        assert "\x1b" not in text and "\x07" not in text, text
        for said in ("thread commit-watcher stopped on an exception no code caught", "thread saw w\\n",
                     "exception ignored in", "finaliser saw w\\n", "Task exception was never retrieved",
                     "task saw w\\n", "stopped on an exception no code caught", "main saw w\\n"):
            assert said in text, (said, text)
