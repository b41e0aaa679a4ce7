"""What the dashboard reads from disk: validator and miner state dirs, and a localnet directory.

Only these files are ever opened: `scores.jsonl`, `validator_windows.jsonl`, `weights.jsonl`,
`scorebook.json` (validators), `miner_windows.jsonl` and the tail of `node.log` for its `[SYNC]` lines (miners),
and `nodes.json` (a localnet). Besides, the run state looks at files without opening them: when a
window file last grew, whether a localnet's `report.json` exists, and the size of a node's state
file against the free disk beside it. `eval_secret`, wallets, bucket credentials and model state are
never read, so the dashboard cannot show them. Every record is checked against the field types
of its `templar.runtime.records` class before use; a line that fails is counted and skipped, and each
source lists what is missing in `problems()` for the page to say.

Histories are bounded (`MAX_WINDOWS` windows, `MAX_PEER_RECORDS` per peer, `MAX_PEERS`
hotkeys), so a dashboard left open for weeks on a 256-peer subnet stays small, and a file that
has grown for weeks is read from its last few MiB (`*_START_BYTES`), so the first page is quick.
"""

from __future__ import annotations

import functools
import math
import os
import re
import time
from collections import deque
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

from templar.dashboard.jsonl import JsonlTail
from templar.runtime.records import (
    MINER_WINDOWS_FILE,
    SCORES_FILE,
    VALIDATOR_WINDOWS_FILE,
    WEIGHTS_FILE,
    MinerWindowRecord,
    PeerScoreRecord,
    ValidatorWindowRecord,
    WeightsRecord,
)
from templar.runtime.roster import CHAIN_FILE, NODES_FILE, NodeInfo, RosterError, lead_validator, read_nodes
from templar.validator.files import BOOK_FILE

LOG_FILE = "node.log"         # the localnet passes --logging.file <state dir>/node.log
REPORT_FILE = "report.json"   # a localnet writes it when it ends
MAX_WINDOWS = 2000
MAX_PEER_RECORDS = 400
MAX_PEERS = 4096
MAX_WEIGHTS_RECORDS = 200
STRIP_WINDOWS = 8                        # windows in a peer's status strip
MAX_BOOK_BYTES = 16 * 1024 * 1024
LOG_TAIL_BYTES = 64 * 1024
LOG_INTERVAL = 5.0                       # seconds between two looks at a node.log
SCORES_START_BYTES = 16 * 1024 * 1024   # a long-running validator's scores.jsonl is read from its last
WINDOWS_START_BYTES = 4 * 1024 * 1024   # 16 MiB (~230 windows of a 256-peer subnet), window logs from 4 MiB
HOTKEY_RE = re.compile(r"^[1-9A-HJ-NP-Za-km-z]{1,64}$")  # base58: what an ss58 address is made of

_TYPES = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}
MAX_TEXT = 200


@functools.cache
def _schema(cls: type) -> tuple[tuple[str, frozenset[type], bool, bool, bool], ...]:
    """(name, accepted exact types, may be None, is float, may be absent) per field of a record
    dataclass. Exact types (`type(v) in ...`), so True is not an int and 1 is not a bool. A field
    with a default may be absent (records written before it existed)."""
    out = []
    for f in fields(cls):
        kinds = [k.strip() for k in str(f.type).split("|")]
        types = frozenset(t for k in kinds for t in _TYPES.get(k, ()))
        optional = f.default is not MISSING
        out.append((f.name, types, "None" in kinds, "float" in kinds, optional))
    return tuple(out)


def parse_record(cls: type, raw: dict) -> object | None:
    """`raw` as an instance of the record dataclass `cls`, or None if a field is missing or mistyped.

    Unknown keys are ignored (a newer writer may add fields); ints are accepted for floats.
    """
    values = {}
    for name, types, nullable, is_float, optional in _schema(cls):
        if optional and name not in raw:
            continue
        value = raw.get(name, raw)  # `raw` itself marks a missing key
        if value is None:
            if not nullable:
                return None
        elif type(value) not in types or (type(value) is str and len(value) > MAX_TEXT):
            return None
        elif is_float:
            value = float(value)
        values[name] = value
    return cls(**values)


def valid_hotkey(text: str) -> bool:
    return bool(HOTKEY_RE.match(text))


class RecordFile:
    """A JSONL tail whose lines are parsed into one record class; bad ones are counted."""

    def __init__(self, path: Path, cls: type, start_bytes: int | None = None):
        self.tail = JsonlTail(path, start_bytes=start_bytes)
        self.cls = cls
        self.invalid = 0

    def poll(self) -> tuple[list, bool]:
        raw, reset = self.tail.poll()
        out = []
        for item in raw:
            record = parse_record(self.cls, item)
            if record is None:
                self.invalid += 1
            else:
                out.append(record)
        return out, reset

    def problems(self) -> list[str]:
        st, name = self.tail.status, self.tail.path.name
        out = []
        if st.error:
            out.append(f"{name}: {st.error}")
        elif not st.exists:
            out.append(f"{name}: not written yet")
        if st.skipped:
            out.append(f"{name}: {st.skipped} line(s) skipped ({st.last_skip_reason})")
        if self.invalid:
            out.append(f"{name}: {self.invalid} record(s) without the expected fields skipped")
        return out


@dataclass
class BookEntry:
    """The score book's view of one peer: what the JSONL records do not carry."""

    uid: int
    mu: float
    rating_mu: float
    rating_sigma: float
    primary_evals: int
    fast_eval_passes: int
    fast_eval_fails: int
    last_status: str
    first_seen_window: int
    last_seen_window: int
    score: float
    weight: float


def parse_book(text: bytes) -> dict[str, BookEntry]:
    """`scorebook.json` through the validator's own strict schema; raises ValueError with the reason."""
    from templar.gauntlet import ScoreBook, ScoreBookError

    try:
        book = ScoreBook.from_json(text)
    except ScoreBookError as exc:
        raise ValueError(str(exc)[:300]) from exc
    return {hk: BookEntry(uid=r.uid, mu=r.mu, rating_mu=r.rating[0], rating_sigma=r.rating[1],
                          primary_evals=r.primary_evals, fast_eval_passes=r.fast_eval_passes,
                          fast_eval_fails=r.fast_eval_fails, last_status=r.last_status,
                          first_seen_window=r.first_seen_window, last_seen_window=r.last_seen_window,
                          score=r.score, weight=r.weight)
            for hk, r in book.peers.items()}


class ValidatorSource:
    """One validator's state dir: window records, per-peer score history, its score book."""

    def __init__(self, name: str, directory: Path):
        self.name = name
        self.directory = Path(directory)
        self.scores = RecordFile(self.directory / SCORES_FILE, PeerScoreRecord, SCORES_START_BYTES)
        self.windows_file = RecordFile(self.directory / VALIDATOR_WINDOWS_FILE, ValidatorWindowRecord,
                                       WINDOWS_START_BYTES)
        self.windows: deque[ValidatorWindowRecord] = deque(maxlen=MAX_WINDOWS)
        self.weights_file = RecordFile(self.directory / WEIGHTS_FILE, WeightsRecord, WINDOWS_START_BYTES)
        self.weights: deque[WeightsRecord] = deque(maxlen=MAX_WEIGHTS_RECORDS)
        """Weight-setting attempts and outcomes (`templar.validator.weights`), newest last."""
        self.history: dict[str, deque[PeerScoreRecord]] = {}
        self.book: dict[str, BookEntry] = {}
        self.book_error = ""
        self._book_stamp: tuple[int, int] | None = None
        self.last_record_at = 0.0
        """When its window file last grew (its mtime): how the run state tells a stopped node."""

    def refresh(self) -> bool:
        changed = False
        records, reset = self.scores.poll()
        if reset:
            self.history.clear()
            changed = True
        for rec in records:
            if not valid_hotkey(rec.hotkey):
                self.scores.invalid += 1
                continue
            hist = self.history.get(rec.hotkey)
            if hist is None:
                if len(self.history) >= MAX_PEERS:  # forget the peer seen longest ago
                    oldest = min(self.history, key=lambda h: self.history[h][-1].window)
                    del self.history[oldest]
                hist = self.history[rec.hotkey] = deque(maxlen=MAX_PEER_RECORDS)
            hist.append(rec)
            changed = True
        wrecs, reset = self.windows_file.poll()
        if reset:
            self.windows.clear()
            changed = True
        self.windows.extend(wrecs)
        changed |= bool(wrecs)
        self.last_record_at = _mtime(self.windows_file.tail.path) if self.windows else 0.0
        weights, reset = self.weights_file.poll()
        if reset:
            self.weights.clear()
        self.weights.extend(weights)
        changed |= bool(weights) or reset
        return self._refresh_book() or changed

    def _refresh_book(self) -> bool:
        path = self.directory / BOOK_FILE
        try:
            st = os.stat(path)
        except FileNotFoundError:
            changed = bool(self.book) or self._book_stamp is not None
            self.book, self._book_stamp, self.book_error = {}, None, ""
            return changed
        except OSError as exc:
            self.book_error = f"{BOOK_FILE}: {exc.strerror or exc}"
            return False
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._book_stamp:
            return False
        self._book_stamp = stamp
        if st.st_size > MAX_BOOK_BYTES:
            self.book_error = f"{BOOK_FILE}: {st.st_size} bytes, over the {MAX_BOOK_BYTES} cap; not read"
            return True
        try:
            self.book = parse_book(path.read_bytes())
            self.book_error = ""
        except (OSError, ValueError) as exc:
            self.book_error = f"{BOOK_FILE}: {exc}"  # keep the last good book on screen
        return True

    # ---- derived views ----------------------------------------------------------------------

    @property
    def last_window(self) -> ValidatorWindowRecord | None:
        return self.windows[-1] if self.windows else None

    def table_window(self) -> int | None:
        """The newest window whose peer records are complete (its window record came after them)."""
        if self.windows:
            return self.windows[-1].window
        latest = [h[-1].window for h in self.history.values() if h]
        return max(latest) if latest else None

    def current(self) -> dict[str, PeerScoreRecord]:
        """Each peer's record in `table_window()` (or its latest before it, for peers not scored then)."""
        window = self.table_window()
        if window is None:
            return {}
        out = {}
        for hotkey, hist in self.history.items():
            for rec in reversed(hist):
                if rec.window <= window:
                    if rec.window >= window - 1 or hotkey in self.book:
                        out[hotkey] = rec
                    break
        return out

    def recent_statuses(self, hotkey: str, count: int = STRIP_WINDOWS) -> list[tuple[int, str]]:
        hist = self.history.get(hotkey, ())
        return [(r.window, r.status) for r in list(hist)[-count:]]

    def problems(self) -> list[str]:
        out = [f"{self.name}: {p}" for p in (*self.windows_file.problems(), *self.scores.problems())]
        # weights.jsonl appears with the first weights window: its absence is not a problem, bad lines are
        out += [f"{self.name}: {p}" for p in self.weights_file.problems() if not p.endswith("not written yet")]
        if not self.directory.is_dir():
            out.insert(0, f"{self.name}: state dir {self.directory} does not exist")
        if self.book_error:
            out.append(f"{self.name}: {self.book_error}")
        elif self._book_stamp is None:
            out.append(f"{self.name}: {BOOK_FILE}: not written yet")
        return out


@dataclass
class SyncLine:
    """The last `[SYNC]` line of a node's log: its join state before any window record exists."""

    time: str
    text: str


BUSY_WINDOWS = 10
"""Windows a miner's busy fraction is averaged over (the Miners page)."""


class MinerSource:
    """One miner's state dir: its window records and join state."""

    def __init__(self, name: str, directory: Path):
        self.name = name
        self.directory = Path(directory)
        self.file = RecordFile(self.directory / MINER_WINDOWS_FILE, MinerWindowRecord, WINDOWS_START_BYTES)
        self.windows: deque[MinerWindowRecord] = deque(maxlen=MAX_WINDOWS)
        self.sync: SyncLine | None = None
        self._log_stamp: tuple[int, int] | None = None
        self._log_checked = -LOG_INTERVAL
        self.last_record_at = 0.0

    def refresh(self) -> bool:
        records, reset = self.file.poll()
        if reset:
            self.windows.clear()
        self.windows.extend(records)
        self.last_record_at = _mtime(self.file.tail.path) if self.windows else 0.0
        return bool(records) or reset or self._refresh_sync()

    def _refresh_sync(self) -> bool:
        """The last `[SYNC]` line, from the log's last 64 KiB, looked at every LOG_INTERVAL at most."""
        now = time.monotonic()
        if now - self._log_checked < LOG_INTERVAL:
            return False
        self._log_checked = now
        path = self.directory / LOG_FILE
        try:
            st = os.stat(path)
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp == self._log_stamp:
                return False
            self._log_stamp = stamp
            with open(path, "rb") as f:
                f.seek(max(0, st.st_size - LOG_TAIL_BYTES))
                tail = f.read(LOG_TAIL_BYTES).decode("utf-8", "replace")
        except OSError:
            return False
        for line in reversed(tail.splitlines()):
            at = line.find("[SYNC]")
            if at >= 0:
                sync = SyncLine(time=line[:19] if line[:4].isdigit() else "", text=line[at:at + 240])
                changed = sync != self.sync
                self.sync = sync
                return changed
        return False

    @property
    def last(self) -> MinerWindowRecord | None:
        return self.windows[-1] if self.windows else None

    @property
    def trained(self) -> MinerWindowRecord | None:
        """The last window it trained and aggregated: a catch-up record after it (the window
        ended waiting for the lead's update, as the last one of a run whose lead stopped first
        does) is not what the miner's numbers are."""
        return next((r for r in reversed(self.windows) if r.phase != "catchup"), None)

    @property
    def catchups_after(self) -> list[MinerWindowRecord]:
        """The catch-up records after `trained` (all of them, if it never trained)."""
        out = []
        for r in reversed(self.windows):
            if r.phase != "catchup":
                break
            out.append(r)
        return out[::-1]

    @property
    def busy(self) -> float | None:
        """The measured busy fraction: training seconds over the windows' wall-clock seconds, the mean
        `utilisation` of the last `BUSY_WINDOWS` windows it trained (None before any, or from records
        that predate the field)."""
        trained = [w.utilisation for w in self.windows if w.train_seconds > 0][-BUSY_WINDOWS:]
        return sum(trained) / len(trained) if trained else None

    def phase(self) -> str:
        if self.windows:
            return self.windows[-1].phase
        if self.sync:
            return "catchup" if "catch" in self.sync.text.lower() else "startup"
        return "unknown"

    def problems(self) -> list[str]:
        out = [f"{self.name}: {p}" for p in self.file.problems()]
        if not self.directory.is_dir():
            out.insert(0, f"{self.name}: state dir {self.directory} does not exist")
        return out


@dataclass
class LocalnetDir:
    """A localnet `--out` directory: its roster (`templar.runtime.roster`), chain file and each
    node's state dir."""

    out: Path
    nodes: list[NodeInfo] = field(default_factory=list)
    error: str = ""
    loaded_mtime: float = 0.0
    """nodes.json's modification time when it was read: a newcomer (`templar localnet --newcomer`)
    rewrites it while the run goes on."""

    def load(self) -> None:
        self.loaded_mtime = _mtime(self.out / NODES_FILE)
        try:
            self.nodes, self.error = read_nodes(self.out), ""
        except RosterError as exc:
            self.error = str(exc)

    @property
    def changed(self) -> bool:
        """nodes.json was rewritten since it was read."""
        return _mtime(self.out / NODES_FILE) != self.loaded_mtime

    @property
    def chain_file(self) -> Path:
        return self.out / CHAIN_FILE

    @property
    def finished(self) -> bool:
        """The localnet wrote its report: it has stopped (a new run starts by clearing the folder)."""
        return (self.out / REPORT_FILE).is_file()

    def lead(self) -> NodeInfo | None:
        return lead_validator(self.nodes)


def _mtime(path: Path) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)
