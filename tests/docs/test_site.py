"""The generated parts of the documentation site (docs/hooks.py) and the strict build itself."""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import skyward

ROOT = Path(__file__).resolve().parents[2]


def _hooks():
    spec = importlib.util.spec_from_file_location("skyward_docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = _hooks()


def _flatten(nav: list) -> list[str]:
    out: list[str] = []
    for entry in nav:
        for value in entry.values():
            out += _flatten(value) if isinstance(value, list) else [value]
    return out


def test_nav_lists_the_guides_that_exist_and_no_others(tmp_path: Path) -> None:
    (tmp_path / "guides").mkdir()
    (tmp_path / "index.md").write_text("# Skyward\n")
    (tmp_path / "how-it-works.md").write_text("# How it works\n")
    (tmp_path / "guides" / "ssh.md").write_text("# SSH hosts: `sky.SSH`\n")
    (tmp_path / "guides" / "operators.md").write_text("# Operators\n")
    (tmp_path / "guides" / "zz-new-topic.md").write_text("# A guide nobody listed\n")
    (tmp_path / "guides" / "operators-advanced.md").write_text("# More operators\n")

    nav = hooks.build_nav(tmp_path, [("errors", "Errors")])
    pages = _flatten(nav)
    # Known guides in reading order, an unknown one after them; missing ones are simply absent.
    assert [p for p in pages if p.startswith("guides/")] == [
        "guides/operators.md", "guides/operators-advanced.md", "guides/ssh.md",
        "guides/zz-new-topic.md"]
    assert "guides/healing.md" not in pages
    assert pages[0] == "index.md" and "reference/api/errors.md" in pages
    assert pages.index("how-it-works.md") > pages.index("guides/zz-new-topic.md")
    guides = next(e["Guides"] for e in nav if "Guides" in e)
    assert {"SSH hosts: sky.SSH": "guides/ssh.md"} in guides  # titles from the H1, backticks dropped


def test_nav_gives_pages_in_other_folders_a_place(tmp_path: Path) -> None:
    (tmp_path / "index.md").write_text("# Skyward\n")
    (tmp_path / "extra").mkdir()
    (tmp_path / "extra" / "faq.md").write_text("# FAQ\n")
    assert "extra/faq.md" in _flatten(hooks.build_nav(tmp_path))


def test_every_public_name_has_an_api_entry_that_exists_in_the_source() -> None:
    documented = {name: path for group in hooks.api_groups().values() for name, path in group}
    missing = [n for n in skyward.__all__ if n not in documented and not n.startswith("__")]
    assert not missing, f"public names with no API reference entry: {missing}"
    for name, path in documented.items():
        # The dotted path mkdocstrings reads must exist as written: module, then attributes.
        parts = path.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
                break
            except ImportError:
                continue
        for attr in parts[cut:]:
            assert hasattr(obj, attr), f"sky.{name}: {path} does not exist ({attr!r})"
            obj = getattr(obj, attr)


def test_cli_reference_has_every_subcommand_and_flag() -> None:
    from skyward.named import cli

    text = hooks.cli_markdown()
    parser = cli._parser()
    for name, sub in hooks._subcommands(parser).items():
        assert f"## `skyward {name}`" in text
        for action in sub._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert flag in text, f"skyward {name} {flag} missing from the CLI reference"


def test_module_map_lists_every_module() -> None:
    text = hooks.modules_markdown()
    for folder, _ in hooks.MODULE_FOLDERS:
        for file in (ROOT / folder).glob("*.py"):
            assert f"`{folder}/{file.name}`" in text


@pytest.mark.skipif(shutil.which("mkdocs", path=str(Path(sys.executable).parent)) is None,
                    reason="mkdocs is not installed (pip install -e '.[docs]')")
def test_site_builds_strictly(tmp_path: Path) -> None:
    """What CI runs: a broken link, anchor or API reference fails the build."""
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    proc = subprocess.run(
        [mkdocs, "build", "--strict", "--quiet", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").exists()
    assert (tmp_path / "site" / "reference" / "api" / "index.html").exists()
