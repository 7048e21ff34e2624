"""Package sources set only in uv's settings, or only in pip's config files, reach both tools
: uv resolves a pool's lock and pip fetches its wheelhouse, and neither reads the
other's settings, nor does an environment made by uv have a pip to ask for its own.

The settings are read from real files in a temporary home and project; the last tests resolve
and fetch a lock from a package index this test serves on loopback, named only in uv's settings.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from skyward.bootstrap import wheelhouse
from skyward.records import pkglock, pkgsources, resolver

sys.path.insert(0, str(Path(__file__).parent / "record"))
from pkgindex import NAME, Index

SETTINGS = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CONFIG_FILE", "UV_INDEX_URL",
            "UV_DEFAULT_INDEX", "UV_INDEX", "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS", "UV_CONFIG_FILE", "UV_NO_CONFIG",
            "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS")


@pytest.fixture
def clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No index settings but the test's own: an empty home, an empty project folder as the working
    directory, no system config dirs; returns the project folder."""
    for name in SETTINGS:
        monkeypatch.delenv(name, raising=False)
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_DIRS", str(tmp_path / "etc-xdg"))
    monkeypatch.chdir(project)
    return project


def test_uv_environment_settings(clean: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UV_DEFAULT_INDEX", "https://mirror.example/simple")
    monkeypatch.setenv("UV_INDEX", "internal=https://pkgs.example/simple https://other.example/simple")
    monkeypatch.setenv("UV_INDEX_INTERNAL_USERNAME", "ci")
    monkeypatch.setenv("UV_INDEX_INTERNAL_PASSWORD", "t0k/en")
    monkeypatch.setenv("UV_EXTRA_INDEX_URL", "https://extra.example/simple")
    monkeypatch.setenv("UV_FIND_LINKS", "/wheels,https://links.example/")
    got = pkgsources.uv_settings()
    assert got.default == "https://mirror.example/simple"
    # A named index's credentials (uv's UV_INDEX_<NAME>_*) become its URL's, for pip.
    assert got.extra == ("https://ci:t0k%2Fen@pkgs.example/simple", "https://other.example/simple",
                         "https://extra.example/simple")
    assert got.find_links == ("/wheels", "https://links.example/")


def test_uv_toml_of_the_project_the_user_and_pyproject(clean: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    user = tmp_path / "home" / ".config" / "uv"
    user.mkdir(parents=True)
    (user / "uv.toml").write_text('extra-index-url = ["https://user.example/simple"]\n'
                                  '[[index]]\nurl = "https://corp.example/simple"\ndefault = true\n')
    (clean / "pyproject.toml").write_text(
        '[project]\nname = "app"\nversion = "0"\n\n'
        '[[tool.uv.index]]\nname = "gpu"\nurl = "https://gpu.example/simple"\n\n'
        '[[tool.uv.index]]\nname = "pinned-only"\nurl = "https://explicit.example/simple"\nexplicit = true\n\n'
        '[tool.uv.pip]\nfind-links = ["/project/wheels"]\n')
    (clean / "sub").mkdir()
    monkeypatch.chdir(clean / "sub")  # found from a folder below, as uv finds it
    got = pkgsources.uv_settings()
    assert got.default == "https://corp.example/simple"  # the user's default; the project sets none
    assert got.extra == ("https://gpu.example/simple", "https://user.example/simple")  # explicit: left out
    assert got.find_links == ("/project/wheels",)
    # A uv.toml beside it wins over the pyproject, the project's default over the user's.
    (clean / "uv.toml").write_text('index-url = "https://project.example/simple"\n')
    assert pkgsources.uv_settings().default == "https://project.example/simple"
    assert pkgsources.uv_settings().extra == ("https://user.example/simple",)
    # UV_CONFIG_FILE alone, or no file at all.
    other = tmp_path / "other.toml"
    other.write_text('[pip]\nextra-index-url = ["https://chosen.example/simple"]\n')
    monkeypatch.setenv("UV_CONFIG_FILE", str(other))
    assert pkgsources.uv_settings() == pkgsources.Settings("", ("https://chosen.example/simple",), ())
    monkeypatch.setenv("UV_NO_CONFIG", "1")
    assert pkgsources.uv_settings() == pkgsources.Settings()


def test_pip_conf_is_read_without_pip(clean: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    user = tmp_path / "home" / ".config" / "pip"
    user.mkdir(parents=True)
    (user / "pip.conf").write_text("[global]\nindex-url = https://user.example/simple\n"
                                   "extra-index-url =\n    https://a.example/simple\n    https://b.example/simple\n"
                                   "[install]\nfind_links = /user/wheels\n")
    assert pkgsources.pip_settings() == pkgsources.Settings(
        "https://user.example/simple", ("https://a.example/simple", "https://b.example/simple"), ("/user/wheels",))
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "https://env.example/simple")  # the environment wins
    assert pkgsources.pip_settings().extra == ("https://env.example/simple",)
    chosen = tmp_path / "chosen.conf"
    chosen.write_text("[global]\nindex-url = https://chosen.example/simple\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(chosen))  # hides the user's file, as pip does
    assert pkgsources.pip_settings() == pkgsources.Settings("https://chosen.example/simple",
                                                            ("https://env.example/simple",), ())
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    assert pkgsources.pip_settings().default == ""


def test_each_tool_gets_what_the_other_is_configured_with(clean: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", "https://pip-default.example/simple")
    monkeypatch.setenv("PIP_FIND_LINKS", "/pip/wheels")
    (clean / "uv.toml").write_text('[[index]]\nname = "private"\nurl = "https://uv-private.example/simple"\n')
    # uv: pip's default index (uv has none of its own); its own index it reads itself.
    uv = dict(resolver.sources(["https://pool.example/simple"]).env)
    assert uv == {"UV_INDEX_URL": "https://pip-default.example/simple",
                  "UV_EXTRA_INDEX_URL": "https://pool.example/simple", "UV_FIND_LINKS": "/pip/wheels"}
    # pip: the pool's index, uv's, its own.
    assert resolver.pip_index_env(["https://pool.example/simple"]) == {
        "PIP_INDEX_URL": "https://pip-default.example/simple",
        "PIP_EXTRA_INDEX_URL": "https://pool.example/simple https://uv-private.example/simple",
        "PIP_FIND_LINKS": "/pip/wheels"}
    # uv's default index wins over pip's, which stays one to look in.
    monkeypatch.setenv("UV_DEFAULT_INDEX", "https://uv-default.example/simple")
    assert "UV_INDEX_URL" not in dict(resolver.sources().env)
    assert dict(resolver.sources().env)["UV_EXTRA_INDEX_URL"] == "https://pip-default.example/simple"
    pip = resolver.pip_index_env(())
    assert pip["PIP_INDEX_URL"] == "https://uv-default.example/simple"
    assert pip["PIP_EXTRA_INDEX_URL"].split() == ["https://uv-private.example/simple",
                                                   "https://pip-default.example/simple"]


# -- a lock from an index that only uv's settings name ---------------------------------------------
@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    index = Index(tmp_path / "index")
    index.publish("1.0")
    index.publish("2.0")
    yield index.serve("127.0.0.1")
    index.close()


@pytest.mark.parametrize("where", ["UV_INDEX", "uv.toml"])
def test_a_lock_and_its_wheels_from_an_index_only_uv_knows(served: str, tmp_path: Path, where: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKYWARD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.chdir(tmp_path)
    if where == "UV_INDEX":
        monkeypatch.setenv("UV_INDEX", f"private={served}")
    else:
        (tmp_path / "uv.toml").write_text(f'[[index]]\nname = "private"\nurl = "{served}"\n')
    locked = resolver.resolve([NAME], python=sys.executable)
    assert [(p.name, p.version) for p in locked] == [(NAME, "2.0")]
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    wheels = wheelhouse.wheels_for_lock(pkglock.text(locked), here)
    assert [w.name for w in wheels] == [f"{NAME}-2.0-py3-none-any.whl"]
