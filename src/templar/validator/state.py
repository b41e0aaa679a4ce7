"""A validator's own state beside the node's: its score book, its memory of recent uploads and its
private evaluation secret.

The book and the replay memory (`templar.validator.replays`) are saved inside the node's state file
(`state.safetensors`, with θ and the window), so model, window, scores and remembered uploads change
together at a window's commit point; `scorebook.json` is a readable copy for operators and the
dashboard. The secret keys the validator's private draws.
"""

from __future__ import annotations

import os
from pathlib import Path

from templar.core.atomic import atomic_write
from templar.core.log import context
from templar.gauntlet import ScoreBook, ScoreBookError
from templar.runtime.state import NodeState
from templar.validator.files import BOOK_FILE, SECRET_BYTES
from templar.validator.replays import ReplayMemory, ReplayMemoryError


def load_or_create_secret(path: Path) -> bytes:
    """This validator's private randomness for D_rand, S_t and fingerprints, kept across restarts.

    Miners know the public seeds, so anything derived from them alone (say, next window's random
    pages) could be trained on in advance; a per-validator secret makes those choices unpredictable.
    A new secret is said out loud when the directory already holds other state (a lost or damaged
    secret changes every private draw from here on; nothing else is lost).
    """
    problem = None
    if path.exists():
        secret = path.read_bytes()
        if len(secret) == SECRET_BYTES:
            return secret
        problem = f"is malformed ({len(secret)} bytes, expected {SECRET_BYTES})"
    elif any((path.parent / name).exists() for name in ("state.safetensors", BOOK_FILE)):
        problem = "is missing while the directory holds other state"
    secret = os.urandom(SECRET_BYTES)
    atomic_write(path, secret, mode=0o600)
    if problem is not None:
        context(phase="startup").warning(f"{path} {problem}: made a new evaluation secret (this validator's "
                                         "private draws of pages and peers change from here on)")
    return secret


def load_book(state_dir: Path, state: NodeState, own: bool, *, lead: bool = False) -> ScoreBook:
    """The book saved atomically with our state (never a window apart from it); after a long stop, the
    book of our own state file beside the checkpoint's θ (`restore` carries it: the windows between
    were scored by no one here, so none counts twice).

    `scorebook.json` is only a readable copy: it may be a window ahead of or behind any state
    we could restore, so it is read only for an own state saved without a book (older versions).
    Without a state file of our own, a checkpoint starts an empty book rather than one that would
    count some windows twice."""
    log = context(phase="startup")
    saved = state.extra.get("scorebook")
    if isinstance(saved, str):
        try:
            return ScoreBook.from_json(saved)
        except ScoreBookError as exc:  # unreadable is never "no book": the readable copy, said out loud
            log.error(f"score book in the state file unreadable ({exc}); taking its readable copy {BOOK_FILE}")
    path = state_dir / BOOK_FILE
    if not own:
        if path.exists():
            log.warning(f"[SYNC] no state file of our own to take the score book from: starting an empty one "
                        f"({path.name} is a readable copy that may be windows ahead of or behind this state)")
        elif lead:
            log.warning("[SYNC] the lead starts without its score book: every peer's reputation restarts from "
                        "zero (windows replayed now are stepped, never scored)")
        return ScoreBook()
    try:
        return ScoreBook.load(path)
    except ScoreBookError as exc:
        backup = path.with_suffix(".corrupt")
        path.replace(backup)
        log.error(f"score book unreadable ({exc}); moved to {backup.name}, starting empty")
        return ScoreBook()


def load_replays(state: NodeState, windows: int) -> ReplayMemory:
    """The replay memory saved with our own state, spanning `windows` (the run's `replay_windows`;
    empty without a state file of our own, or for one saved without a memory by an older version);
    a damaged one is said out loud and restarts empty (replays of the windows it held go unnoticed;
    nothing else is lost)."""
    saved = state.extra.get("replays")  # only ever our own (`restore` carries it beside a checkpoint's θ)
    if saved is None:
        return ReplayMemory(windows)
    try:
        return ReplayMemory.from_json(saved, windows)
    except ReplayMemoryError as exc:
        context(phase="startup").error(f"replay memory in the state file unreadable ({exc}): starting an empty one")
        return ReplayMemory(windows)


def save_book_copy(state_dir: Path, book: ScoreBook, window: int) -> None:
    """`scorebook.json`, the book's readable copy (after the state file, which holds the book itself)."""
    try:
        book.save(state_dir / BOOK_FILE)
    except OSError as exc:
        context(window=window, phase="save").warning(
            f"readable copy {BOOK_FILE} not written ({exc}); the book is safe in the state file")


def with_book(state: NodeState, book: ScoreBook, replays: ReplayMemory | None = None) -> NodeState:
    """`state` carrying `book` (and the replay memory), ready for the node's state file (one atomic
    write with θ)."""
    state.extra = {"scorebook": book.to_json()}
    if replays is not None:
        state.extra["replays"] = replays.to_json()
    return state
