"""A validator's own state beside the node's: lost or damaged pieces are said out loud."""

from __future__ import annotations

import pytest
from loguru import logger

from templar.gauntlet import ScoreBook
from templar.runtime.state import NodeState
from templar.validator.files import BOOK_FILE, SECRET_BYTES
from templar.validator.state import load_book, load_or_create_secret, with_book


@pytest.fixture
def warnings():
    lines: list[str] = []
    handler = logger.add(lambda m: lines.append(m.record["message"]), level="WARNING")
    yield lines
    logger.remove(handler)


def test_a_fresh_directory_gets_a_secret_quietly_and_keeps_it(tmp_path, warnings):
    first = load_or_create_secret(tmp_path / "eval_secret")
    assert len(first) == SECRET_BYTES and load_or_create_secret(tmp_path / "eval_secret") == first
    assert (tmp_path / "eval_secret").stat().st_mode & 0o777 == 0o600
    assert warnings == []


def test_a_lost_secret_beside_other_state_is_a_warning(tmp_path, warnings):
    (tmp_path / "state.safetensors").write_bytes(b"x")
    load_or_create_secret(tmp_path / "eval_secret")
    assert len(warnings) == 1 and "missing while the directory holds other state" in warnings[0]


def test_a_malformed_secret_is_replaced_with_a_warning(tmp_path, warnings):
    (tmp_path / "eval_secret").write_bytes(b"short")
    secret = load_or_create_secret(tmp_path / "eval_secret")
    assert len(secret) == SECRET_BYTES
    assert len(warnings) == 1 and "malformed (5 bytes" in warnings[0]


def test_a_lead_without_its_book_says_so(tmp_path, warnings):
    book = load_book(tmp_path, NodeState(window=5, global_step=3), own=False, lead=True)
    assert len(book) == 0
    assert len(warnings) == 1 and "lead starts without its score book" in warnings[0]
    warnings.clear()
    load_book(tmp_path, NodeState(window=5, global_step=3), own=False)  # a follower: nothing to say
    assert warnings == []


def test_the_book_travels_with_the_state(tmp_path):
    book = ScoreBook()
    book.get_or_create("hk", 3, 1)
    state = with_book(NodeState(window=1, global_step=0), book)
    assert load_book(tmp_path, state, own=True) == book
    (tmp_path / BOOK_FILE).write_text("{}")  # the readable copy is never preferred to the state's book
    assert load_book(tmp_path, state, own=True) == book


def test_an_unreadable_book_is_never_taken_for_an_empty_one(tmp_path):
    """The book in the state file cannot be parsed: the readable copy is taken, with one line naming both;
    a copy unreadable too is set aside (renamed, never deleted) and the line says the book starts empty."""
    lines: list[str] = []
    handler = logger.add(lambda m: lines.append(m.record["message"]), level="ERROR")
    try:
        book = ScoreBook()
        book.get_or_create("hk", 3, 1)
        book.save(tmp_path / BOOK_FILE)
        state = NodeState(window=1, global_step=0, extra={"scorebook": "{torn"})
        assert load_book(tmp_path, state, own=True) == book
        assert len(lines) == 1 and "score book in the state file unreadable" in lines[0] and BOOK_FILE in lines[0]
        (tmp_path / BOOK_FILE).write_text("{torn")
        assert len(load_book(tmp_path, state, own=True)) == 0
        assert "moved to scorebook.corrupt, starting empty" in lines[-1] and (tmp_path / "scorebook.corrupt").exists()
    finally:
        logger.remove(handler)
