"""The ``skyward`` command imports the module of the command it runs, not every command's: the
others are listed by name and help alone, and that listing, the error for an unknown command
and each command's own help are what the whole parser (every module imported) says."""

from __future__ import annotations

import argparse

import pytest

from skyward.named import cli as named_cli

from .conftest import CLI

# Modules `skyward ls` has no use for: the other commands' modules, and what only starting a
# pool or driving a stack needs.
NOT_FOR_LS = [
    "skyward.dashboard.command",
    "skyward.named.copy",
    "skyward.named.eventlog",
    "skyward.named.install",
    "skyward.named.notebook",
    "skyward.named.proxy",
    "skyward.named.runscript",
    "skyward.named.servecli",
    "skyward.named.shell",
    "skyward.named.sshconfigcli",
    "skyward.spec",
    "skyward.stacks.engine",
    "skyward.providers.local",  # (its sweep of dead Local pools' folders is bootstrap/sweep.py's)
]


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_ls_imports_no_other_commands_module(cli: CLI) -> None:
    result = cli.python("""
        import sys
        from skyward.named.cli import main
        code = main(["ls"])
        print("MODULES", code, *sorted(sys.modules))
    """)
    assert result.code == 0, result
    words = result.out.splitlines()[-1].split()
    assert words[:2] == ["MODULES", "0"], result
    loaded = set(words[2:])
    assert "skyward.named.pools" in loaded, result  # ls did run
    assert not loaded & set(NOT_FOR_LS), sorted(loaded & set(NOT_FOR_LS))


def test_help_lists_every_command_as_the_whole_parser_does(cli: CLI) -> None:
    cli.env["COLUMNS"] = "100"
    whole = named_cli._parser()
    assert set(named_cli._MODULE_COMMANDS) < set(_commands(whole))
    result = cli("--help")
    assert result.code == 0, result
    assert result.out == _format(whole, "100"), result
    assert all(f"\n    {name}" in result.out for name in _commands(whole)), result
    copy = cli("cp", "--help")
    assert copy.code == 0, copy
    assert copy.out == _format(_commands(whole)["cp"], "100"), copy


@pytest.mark.parametrize("name", list(named_cli._MODULE_COMMANDS))
def test_a_module_commands_help_is_its_full_help(name: str, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    expected = _commands(named_cli._parser())[name].format_help()
    with pytest.raises(SystemExit) as exit_:
        named_cli.main([name, "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == expected


def test_an_unknown_command_is_refused_with_every_command_listed(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        named_cli._parser().parse_args(["nosuch"])
    assert exit_.value.code == 2
    expected = capsys.readouterr().err
    assert "invalid choice: 'nosuch'" in expected and "'ssh-config'" in expected
    with pytest.raises(SystemExit) as exit_:
        named_cli.main(["nosuch"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == expected


def _format(parser: argparse.ArgumentParser, columns: str) -> str:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COLUMNS", columns)
        return parser.format_help()
