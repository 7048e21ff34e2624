"""What the docs name outside ``sky.X`` must exist too: the ``skyward`` subcommands and flags they
show (inline code and shell blocks), and the ``pool.X(...)`` / ``session.X(...)`` methods."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import skyward as sky
from skyward.named import cli

from .test_examples import PAGES, ROOT, blocks
from .test_site import hooks

INLINE = re.compile(r"`(skyward [^`]+)`")
SHELL = ("bash", "sh", "shell", "console", "")
METHOD = re.compile(r"(?<![\w./])(pool|session)\.([a-z_]\w*)(?:\(|`)")  # not a path (core/pool.py)
OWNER = {"pool": sky.Pool, "session": sky.Session}


def commands(page: Path) -> Iterator[tuple[str, str]]:
    """(page:line, 'skyward SUB ...') for each command in inline code or a shell block."""
    where = str(page.relative_to(ROOT))
    for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        for m in INLINE.finditer(line):
            yield f"{where}:{n}", m[1]
    for block in blocks(page):
        if block.lang in SHELL:
            for n, line in enumerate(block.code.splitlines(), block.line + 1):
                text = line.strip().removeprefix("$ ")
                if text.startswith("skyward "):
                    yield f"{where}:{n}", text.split(" #")[0]


def unknown(command: str, subcommands: dict) -> list[str]:
    """The subcommands and flags of ``command`` that the parser does not have."""
    words = command.split()
    wrong = []
    for sub in words[1].split("/"):  # `skyward up/down/ls` names several
        if sub not in subcommands:
            wrong.append(sub)
            continue
        flags = {o for action in subcommands[sub]._actions for o in action.option_strings}
        for word in words[2:]:
            flag = word.strip("[](),.").split("=")[0]
            if flag == "--":  # what follows goes to the script or the node
                break
            if flag.startswith("--") and flag not in flags:
                wrong.append(f"{sub} {flag}")
    return wrong


def test_every_documented_command_and_flag_exists() -> None:
    subcommands = hooks._subcommands(cli._parser())
    seen = [(where, cmd) for page in PAGES for where, cmd in commands(page)]
    assert len(seen) > 20  # the extractor finds the docs' commands
    missing = [f"{cmd!r} at {where}: no {', '.join(bad)}" for where, cmd in seen
               if (bad := unknown(cmd, subcommands))]
    assert not missing, "documented commands the CLI does not have:\n" + "\n".join(missing)


def test_the_command_check_catches_a_missing_flag() -> None:
    subcommands = hooks._subcommands(cli._parser())
    assert unknown("skyward down NAME --force", subcommands) == []
    assert unknown("skyward exec demo -- hostname --anything", subcommands) == []
    assert unknown("skyward down NAME --no-such-flag", subcommands) == ["down --no-such-flag"]
    assert unknown("skyward up/nosuch", subcommands) == ["nosuch"]


def test_every_documented_pool_and_session_method_exists() -> None:
    missing = []
    for page in PAGES:
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for m in METHOD.finditer(line):
                owner = OWNER[m[1]]  # a method, or an attribute the class declares (pool.members)
                if not hasattr(owner, m[2]) and m[2] not in getattr(owner, "__annotations__", {}):
                    missing.append(f"{m[1]}.{m[2]} at {page.relative_to(ROOT)}:{n}")
    assert not missing, "documented methods that do not exist:\n" + "\n".join(missing)
