"""Every btcli command the project tells an operator to type exists in the btcli the install ships.

The docs, the deploy files and the fixes the code prints (the doctor's, the weight setter's) name
btcli commands; btcli's command tree changes between releases (`btcli subnet start` is not a
command of 11.x: `btcli hparams start` is). Each mention is resolved against the installed
btcli's own command tree (its typer app, in this process: no network, no wallet): the command
path must lead to a command, and every option must be one it takes.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache

import pytest

from templar.core.config import REPO_ROOT

MENTION = re.compile(r"\bbtcli((?:[ \t]+[^\s`'\"|;),#]+)*)")
SOURCES = ("README.md", "docs/", "deploy/", "src/templar/")


@cache
def btcli():
    """btcli's root command (typer ships its own copy of click: its objects are duck-typed here)."""
    import typer
    from bittensor.cli.main import app

    return typer.main.get_command(app)


def _options(command) -> tuple[set[str], set[str]]:
    """(every option string of `command`, those that take a value)."""
    names, valued = set(), set()
    for p in command.params:
        if getattr(p, "param_type_name", "") != "option":
            continue
        names |= {*p.opts, *p.secondary_opts}
        if not p.is_flag:
            valued |= {*p.opts, *p.secondary_opts}
    return names, valued


def mentions() -> list[tuple[str, str]]:
    """(file:line, the words after `btcli`) of every mention in the tracked sources."""
    files = subprocess.run(["git", "ls-files", *SOURCES], cwd=REPO_ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    out = []
    for name in files:
        if not name.endswith((".md", ".py", ".yml", ".service", ".example")):
            continue
        fenced = False
        for number, line in enumerate((REPO_ROOT / name).read_text(encoding="utf-8").splitlines(), 1):
            if name.endswith(".md"):  # commands are code: a fenced block, or `inline code` in prose
                if line.startswith("```"):
                    fenced = not fenced
                    continue
                if not fenced:
                    line = "`".join(re.findall(r"`([^`]+)`", line))
            for match in MENTION.finditer(line):
                words = match.group(1).split()
                if words and not words[0].startswith(("(", "v1")):  # "btcli (v11 ships ...)" is prose
                    out.append((f"{name}:{number}", " ".join(words)))
    return out


def resolve(words: list[str]) -> str | None:
    """Why `btcli WORDS` is not a valid command line of the installed btcli (None: it is)."""
    command = btcli()
    options, takes_value = _options(command)
    path: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
            continue
        if word.startswith("-"):
            name = word.split("=")[0]
            if name not in options:
                return f"`btcli {' '.join(path)}` has no option {name}"
            skip = name in takes_value and "=" not in word
            continue
        if hasattr(command, "commands"):
            sub = command.commands.get(word)
            if sub is None:
                return f"`btcli {' '.join(path)}` has no command {word!r} (it has: {', '.join(sorted(command.commands))})"
            command, path = sub, [*path, word]
            more, valued = _options(command)
            options, takes_value = options | more, takes_value | valued
    if hasattr(command, "commands") and words and words != ["--version"]:
        return f"`btcli {' '.join(path)}` is a group of commands, not a command"
    return None


def test_the_docs_name_btcli_commands():
    found = mentions()
    assert any(words.startswith("hparams start") for _, words in found), found  # launch.md's subnet start
    assert len(found) >= 10


@pytest.mark.parametrize("where, words", mentions())
def test_every_btcli_command_named_exists_in_the_shipped_btcli(where, words):
    assert resolve(words.split()) is None, f"{where}: btcli {words}: {resolve(words.split())}"


def test_a_command_btcli_does_not_have_is_caught():
    assert "no command 'start'" in resolve(["subnets", "start", "--netuid", "3"])
    assert "no option --wallet.name" in resolve(["subnets", "register", "--netuid", "3", "--wallet.name", "W"])
    assert resolve(["hparams", "start", "--netuid", "3", "-n", "test", "-w", "owner"]) is None
