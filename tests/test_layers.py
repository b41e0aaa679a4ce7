"""The import direction of docs/architecture.md §1: lower floors never import higher ones.

Read from the source with `ast` (nothing is imported, so no torch: well under a second). Every
import counts, the ones inside functions too, because a lazy import is still a dependency. A
package may import its own modules, any package on a lower floor, and the sideways edges listed
in `SIDEWAYS`, nothing else.

The command-line modules are the entry-point floor: `templar/cli.py` and the subcommand modules
it lists (`templar.<package>.cli`, `templar.tools.hparams_cmd`) parse flags and join tools
together, so they may import anything, and nothing in the library may import them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from templar.core.config import REPO_ROOT

SRC = REPO_ROOT / "src" / "templar"

FLOORS: list[tuple[str, set[str]]] = [
    ("pure core", {"core", "compress", "gauntlet"}),
    ("wire", {"wire"}),
    ("I/O", {"storage", "chain", "comms", "data"}),
    ("node runtime", {"runtime"}),
    ("roles", {"miner", "validator", "distributed"}),
    ("tools", {"localnet", "dashboard", "tools", "doctor"}),
]
"""§1's floors, lowest first."""

SIDEWAYS: dict[str, set[str]] = {
    "gauntlet": {"core"},
    "comms": {"storage"},
    "data": {"storage"},
    # The sharded evaluator reuses the validator's LossScore arithmetic (§1: the one edge across the roles).
    "distributed": {"validator.evaluate"},
    # The doctor checks a machine against the run's sizing (GPU memory, a window's payloads).
    "doctor": {"tools.sizing"},
}
"""Imports within a floor, as `package: {package or package.module it may import}`."""

FLOOR = {package: level for level, (_, packages) in enumerate(FLOORS) for package in packages}


def _subcommands() -> set[str]:
    """The modules `templar/cli.py`'s SUBCOMMANDS names, read from its source."""
    tree = ast.parse((SRC / "cli.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and t.id == "SUBCOMMANDS" for t in targets):
                return {value.value for value in node.value.values}  # type: ignore[union-attr]
    raise AssertionError("templar/cli.py has no SUBCOMMANDS")


ENTRY_POINTS = {"templar.cli", *_subcommands()}


def module_name(path: Path, root: Path = SRC) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, root: Path = SRC) -> Iterator[tuple[int, str]]:
    """(line, absolute dotted name) of every import in the file under the package `root`, lazy
    ones included; `from templar.x import y` yields `templar.x.y` too, in case `y` is a module."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            yield node.lineno, target
            for alias in node.names:
                yield node.lineno, f"{target}.{alias.name}"


def violation(source: str, target: str) -> str | None:
    """Why `source` (a module) may not import `target`, or None if it may."""
    if not target.startswith("templar.") or source in ENTRY_POINTS:
        return None
    if target in ENTRY_POINTS:
        return "imports a command-line module (the entry-point floor)"
    src_pkg, dst = source.split(".")[1], target.split(".", 1)[1]
    dst_pkg = dst.split(".")[0]
    if src_pkg == dst_pkg or dst_pkg not in FLOOR:
        return None  # its own package, or `templar.__version__`
    if src_pkg not in FLOOR:
        return f"templar.{src_pkg} is on no floor of the table"
    if FLOOR[dst_pkg] < FLOOR[src_pkg]:
        return None
    if any(dst == allowed or dst.startswith(allowed + ".") for allowed in SIDEWAYS.get(src_pkg, ())):
        return None
    if FLOOR[dst_pkg] > FLOOR[src_pkg]:
        return f"imports the higher floor {FLOORS[FLOOR[dst_pkg]][0]!r} from {FLOORS[FLOOR[src_pkg]][0]!r}"
    return f"imports sideways on the {FLOORS[FLOOR[src_pkg]][0]!r} floor, not listed in SIDEWAYS"


def violations(root: Path = SRC) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        source = module_name(path, root)
        for line, target in imports(path, root):
            why = violation(source, target)
            if why:
                out.append(f"src/{path.relative_to(root.parent)}:{line}: {source} imports {target}: {why}")
    return sorted(set(out))


def test_every_package_is_on_a_floor() -> None:
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and any(p.glob("*.py"))}
    assert packages == set(FLOOR), f"packages not in the table: {packages - set(FLOOR)}; gone: {set(FLOOR) - packages}"


def test_no_package_imports_a_higher_floor_or_sideways_outside_the_table() -> None:
    found = violations()
    assert not found, "imports against docs/architecture.md §1:\n" + "\n".join(found)


@pytest.mark.parametrize(("source", "target", "why"), [
    ("templar.storage.local", "templar.runtime.node", "higher floor"),
    ("templar.dashboard.views", "templar.localnet.runner", "sideways"),
    ("templar.localnet.runner", "templar.dashboard.server", "sideways"),
    ("templar.distributed.train", "templar.validator.loop", "sideways"),
    ("templar.localnet.report", "templar.localnet.cli", "command-line module"),
])
def test_the_check_catches_an_upward_or_sideways_import(source: str, target: str, why: str) -> None:
    assert why in (violation(source, target) or "")


def test_the_check_reads_lazy_and_relative_imports(tmp_path: Path) -> None:
    """A function-level import and a relative one are found and named, with file and line."""
    root = tmp_path / "templar"
    (root / "storage").mkdir(parents=True)
    (root / "storage" / "__init__.py").write_text("")
    (root / "storage" / "bad.py").write_text("def f():\n    from templar.validator import loop\n\n"
                                             "from ..runtime import node\n")
    found = {target: line for line, target in imports(root / "storage" / "bad.py", root)}
    assert found["templar.validator.loop"] == 2 and found["templar.runtime.node"] == 4
    report = "\n".join(violations(root))
    assert "storage/bad.py:2: templar.storage.bad imports templar.validator" in report
    assert "storage/bad.py:4: templar.storage.bad imports templar.runtime" in report



def import_time_targets(path: Path, name: str) -> list[str]:
    """What `path` (module `name`) imports at import time: its top-level imports, not the ones in
    functions nor those under `if TYPE_CHECKING:`."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: list[str] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If):
                if "TYPE_CHECKING" not in ast.unparse(node.test):
                    visit(node.body)
                    visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
            elif isinstance(node, ast.Import):
                targets.extend(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                target = ".".join([*base, *([node.module] if node.module else [])])
                targets.extend([target, *(f"{target}.{alias.name}" for alias in node.names)])

    visit(ast.parse(path.read_text(), filename=str(path)).body)
    return targets


def import_time_edges(root: Path = SRC) -> dict[str, set[str]]:
    """Module → the templar modules its import runs: each import-time target, with the packages above
    it that are not the module's own (importing `templar.a.b.c` runs `templar/a/b/__init__.py` first)."""
    modules = {module_name(path, root): path for path in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for target in import_time_targets(path, name):
            while target and target not in modules:
                target = target.rpartition(".")[0]
            parts = target.split(".")
            for end in range(2, len(parts) + 1):
                above = ".".join(parts[:end])
                if above in modules and above != name and not name.startswith(above + "."):
                    edges.add(above)
        graph[name] = edges
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    circles.append(sorted(group))
    return circles


def test_no_import_circles() -> None:
    """A circle of import-time imports works or fails by which module is imported first (the embedded
    chain's package once imported the dev chain, which imports the client, which imports the store)."""
    found = import_circles(import_time_edges())
    assert not found, "import circles:\n" + "\n".join(" -> ".join(group) for group in found)


def test_the_circle_check_finds_a_circle_through_a_package(tmp_path: Path) -> None:
    root = tmp_path / "templar"
    (root / "chain" / "embedded").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "chain" / "__init__.py").write_text("")
    (root / "chain" / "client.py").write_text("from templar.chain.embedded.store import Clock\n")
    (root / "chain" / "embedded" / "__init__.py").write_text("from templar.chain.dev import make\n")
    (root / "chain" / "embedded" / "store.py").write_text("Clock = 1\n")
    (root / "chain" / "dev.py").write_text("import typing\nif typing.TYPE_CHECKING:\n    import templar.x\n"
                                           "def make():\n    from templar.chain import client\n"
                                           "from templar.chain.client import Clock\n")
    assert import_circles(import_time_edges(root)) == [["templar.chain.client", "templar.chain.dev",
                                                         "templar.chain.embedded"]]
