"""Every rule that changes a score, a weight, a verdict or θ is part of the run.

Such a rule is a field of the run's hparams (`templar.core.config`: the `gauntlet`, `windows`,
`data` and `sync` sections), so it is inside `HParams.digest()`, which every signed payload and
record names: two nodes that apply different rules are two runs and refuse each other's objects.
Code receives the rules from `hp` as arguments; no module holds one.

This test reads the consensus modules with `ast` (nothing imported: well under a second) and fails,
naming file and line, for a module-level numeric constant (or an UPPER_CASE class constant) that is
not on `ALLOWED`: what is left there is plumbing, or a format fixed by the protocol version (also
in the digest), each with the reason it cannot change what counts.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from templar.core.config import REPO_ROOT, HParams, load_hparams

SRC = REPO_ROOT / "src" / "templar"

CONSENSUS_RUNTIME = ("restore", "sync", "train", "compute")
"""The modules of `runtime` outside `runtime/consensus/` whose arithmetic every node must share: joining
(the state a node starts from, the catch-up) and the sync check, the inner steps, what a node computes on
θ (the rest is node plumbing)."""


def consensus_modules() -> list[Path]:
    """`gauntlet/`, `validator/`, `compress/`, `wire/` and `runtime/consensus/` whole, and the runtime modules
    that share their arithmetic."""
    files = [*SRC.glob("gauntlet/*.py"), *SRC.glob("validator/*.py"), *SRC.glob("compress/**/*.py"),
             *SRC.glob("wire/*.py"), *SRC.glob("runtime/consensus/*.py"),
             *(SRC / "runtime" / f"{name}.py" for name in CONSENSUS_RUNTIME)]
    return sorted(files)


ALLOWED: dict[str, str] = {
    # ---- formats and maths fixed by the protocol version (`HParams.protocol`, in the digest)
    "compress/aggregate.py:_FIXED_BITS": "fixed-point width of the exact, order-free sum: part of the aggregation's "
                                         "arithmetic, which a change of would be a new protocol version",
    "compress/sparseloco/aggregate.py:_MANTISSA_BITS": "the exact sum's refusal of off-grid values (the grid has 8 "
                                                       "bits): the wire grid's arithmetic",
    "compress/sparseloco/aggregate.py:_EXP_OFFSET": "float32's exponent range, shifted for the exact sum",
    "compress/sparseloco/aggregate.py:_FIXED_MAX_BITS": "headroom of the exact sum's integer accumulator",
    "compress/sparseloco/grid.py:MANTISSA_BITS": "the SparseLoCo wire grid (8-bit mantissas): a payload format",
    "compress/sparseloco/grid.py:EXP_MIN": "the wire grid's exponent range (float32's normal, finite values)",
    "compress/sparseloco/grid.py:EXP_MAX": "the wire grid's exponent range (float32's normal, finite values)",
    "compress/sparseloco/grid.py:_M_LOW": "derived from MANTISSA_BITS",
    "compress/sparseloco/grid.py:_M_HIGH": "derived from MANTISSA_BITS",
    "wire/codec.py:_QMAX": "int8 quantisation range of the rice-mxint8 codec: a payload format",
    "wire/codec.py:_EXP_MIN": "shared-exponent range of the rice-mxint8 codec: a payload format",
    "wire/codec.py:_EXP_MAX": "shared-exponent range of the rice-mxint8 codec: a payload format",
    "wire/codec.py:_LEVEL_OF_CODE": "the 2-bit codec's code table: a payload format",
    "wire/codec.py:_CODE_SHIFTS": "bit positions of four 2-bit codes in a byte: a payload format",
    "wire/codec.py:_POPCOUNT": "the number of 1 bits of each byte value: arithmetic, not a rule",
    "wire/container.py:_ITEMSIZE": "bytes per element of the dtypes a payload may hold",
    "wire/container.py:_MAX_DOC_BYTES": "byte cap of a payload's signed metadata, checked before parsing",
    "wire/container.py:_MAX_SIGNATURE_HEX": "byte cap of a signature field",
    "runtime/consensus/follow.py:APPLY_FETCH_SECONDS": "a node's own fetch budget for the payloads named by inputs it "
                                             "established late: one that cannot fetch in time stops before the "
                                             "window and catches up; it never changes θ",
    "wire/inputs.py:DIGEST_BYTES": "sha256's digest size",
    "wire/inputs.py:_MAX_DOCUMENT": "byte cap of an inputs record, from MAX_INPUTS",
    "wire/bundle.py:_MAX_DOCUMENT": "byte cap of a bundle's metadata, from MAX_INPUTS",
    "wire/schema.py:_MAX_COUNTER": "largest integer a JSON reader keeps exact (2^53): a parsing bound",
    "wire/schema.py:MAX_INPUTS": "payloads one step may name: above any top-G of a 256-uid subnet (a byte cap)",
    "gauntlet/duplicates.py:_PRIME": "Mersenne prime of the fingerprints' universal hash: how a sketch is computed",
    "gauntlet/rating.py:DEFAULT_RATING": "OpenSkill's own prior (mu 25, sigma 25/3): the unit LossRating is stated in "
                                         "(openskill_beta and _tau are given in it); part of the formula",
    "runtime/consensus/windows.py:STOP_SAVE_SECONDS": "a stop timeout's allowance for the last save (systemd's "
                                           "TimeoutStopSec): how long a node may take to exit, not what counts",
    "runtime/consensus/windows.py:STOP_CHECKPOINT_SECONDS": "a stopping lead's allowance for its checkpoint upload in the "
                                                 "stop timeout: how long a node may take to exit, not what counts",
    # ---- bounds of persisted state and memory, above anything a 256-uid subnet produces
    "gauntlet/records.py:SCHEMA_VERSION": "version of the score book's file format",
    "gauntlet/records.py:MAX_POOL": "schema bound of a pool record: a subnet has at most 256 uids",
    "gauntlet/records.py:Hotkey": "schema bound of a hotkey's length",
    "validator/base.py:BaseKeeper.KEEP": "measured steps kept in memory; a base is at most two windows old, so an "
                                         "older measurement is never looked up",
    "validator/replays.py:MAX_DIGESTS_PER_WINDOW": "memory bound per window, far above any gather (256 uids)",
    "validator/files.py:SECRET_BYTES": "size of the validator's private key for its draws",
    # ---- our own I/O: timeouts, retries, queues, performance (what counts is fixed by timestamps and the lead)
    "compress/native.py:_ABI": "version of the native extension's ABI (a build check)",
    "compress/native.py:_MIN_PARALLEL_NUMEL": "below this the native kernels run on one thread (bit-identical)",
    "compress/select.py:_MAX_GROUP": "rows per pre-filter group of the top-k selection (a speed-up, exact result)",
    "runtime/consensus/peers.py:PEER_LIST_SECONDS": "timeout of our read of the lead's peer list",
    "runtime/consensus/succession.py:POLL_SECONDS": "pause between two looks at a candidate's inputs; whether they "
                                                    "count is judged by their storage timestamp, not by when we look",
    "runtime/consensus/succession.py:READ_SECONDS": "timeout of one read of a candidate's inputs; an unreadable "
                                                    "candidate is never skipped, so a slow read delays, never decides",
    "runtime/consensus/succession.py:LeadHistory.KEEP": "settled decisions kept in memory; one forgotten is read "
                                                        "again from create-only inputs and decided the same",
    "runtime/restore.py:CHECKPOINT_DOWNLOAD_SECONDS": "timeout of a checkpoint download",
    "runtime/sync.py:PROGRESS_READ_SECONDS": "timeout of one read of a lead's progress record; one not read in "
                                             "time is no evidence, never a verdict",
    "runtime/sync.py:RETRY_SECONDS": "pause before catch-up retries a window it could not establish",
    "runtime/sync.py:SyncCheck.KEEP": "own fingerprints kept to compare with a late progress record; nothing to "
                                      "compare is no evidence, never a verdict",
    "validator/lead.py:WindowPublisher.MAX_QUEUED": "bound of the lead's queue of held-back publications",
    "validator/roles.py:PUBLISH_MIN_SECONDS": "time a late lead still gives its own publications",
    "validator/loop.py:LATE_GATHER_SECONDS": "time a late validator still gives its gather (what counts is fixed by "
                                             "the uploads' storage timestamps)",
    "validator/weights.py:FIRST_BACKOFF_BLOCKS": "retry pauses of a refused weights extrinsic",
    "validator/weights.py:SUBMIT_LAG_WINDOWS": "when weights are submitted (how long before an epoch), never what they "
                                               "are",
}
"""module:NAME → why it is not a rule of the run."""


def _numeric(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Constant) and isinstance(n.value, int | float | complex)
               and not isinstance(n.value, bool) for n in ast.walk(node))


def numeric_constants(path: Path) -> Iterator[tuple[int, str]]:
    """(line, name) of every module-level assignment, and every UPPER_CASE class-level one, whose
    value holds a number (`Class.NAME` for the latter)."""
    def scan(body: list[ast.stmt], prefix: str) -> Iterator[tuple[int, str]]:
        for node in body:
            if isinstance(node, ast.ClassDef):
                yield from scan(node.body, f"{prefix}{node.name}.")
                continue
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            else:
                continue
            names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
            for name in names:
                if (not prefix or name.lstrip("_").isupper()) and _numeric(value):
                    yield node.lineno, prefix + name

    yield from scan(ast.parse(path.read_text(), filename=str(path)).body, "")


def test_no_consensus_module_holds_a_rule_of_its_own() -> None:
    unlisted, seen = [], set()
    for path in consensus_modules():
        where = path.relative_to(SRC).as_posix()
        for line, name in numeric_constants(path):
            key = f"{where}:{name}"
            seen.add(key)
            if key not in ALLOWED:
                unlisted.append(f"src/templar/{where}:{line}: {name}")
    assert not unlisted, ("numeric constants in consensus modules that are neither a field of the run's hparams nor "
                          "on tests/test_rules.py's ALLOWED (make them a field of HParams, or list them with the "
                          "reason they cannot change a score, a weight, a verdict or θ):\n  " + "\n  ".join(unlisted))
    stale = sorted(set(ALLOWED) - seen)
    assert not stale, f"ALLOWED names constants that no longer exist: {stale}"


def test_the_scan_finds_what_it_must(tmp_path: Path) -> None:
    """A rule written as a module constant, a class constant or a tuple of numbers is found; a
    string, a flag or a lower-case class attribute is not."""
    module = tmp_path / "m.py"
    module.write_text('MARGIN = 0.1\nLOW, HIGH = -1.0, 2.0\nNAME = "x"\nON = True\n'
                      "class Book:\n    KEEP = 8\n    default = 3\n    def f(self):\n        LOCAL = 4\n")
    assert list(numeric_constants(module)) == [(1, "MARGIN"), (2, "LOW"), (2, "HIGH"), (6, "Book.KEEP")]


@pytest.mark.parametrize("section,field,value", [
    ("gauntlet", "relative_shared_factor", 3.0), ("gauntlet", "proof_gap_history", 8),
    ("gauntlet", "replay_windows", 32), ("windows", "settle_seconds", 0.5), ("data", "holdout_eval_pages", 2),
    ("sync", "max_off_share", 0.0625),
])
def test_a_rule_moved_out_of_a_module_is_part_of_the_runs_digest(section: str, field: str, value: object) -> None:
    """Changing a former module constant changes the run: its digest, which every signed payload,
    record and checkpoint names, so nodes on different rules refuse each other's objects."""
    hp = load_hparams("tiny")
    changed = HParams.model_validate({**hp.model_dump(), section: {**getattr(hp, section).model_dump(), field: value}})
    assert getattr(getattr(changed, section), field) == value
    assert changed.digest() != hp.digest()
