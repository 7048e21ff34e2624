"""Where this machine's Python packages come from: the package indexes and find-links that pip
and uv are configured with here, read from their settings without running either tool.

A pool's packages are resolved by uv and their wheels fetched by pip (skyward.records.pkglock,
skyward.bootstrap.wheelhouse), and an environment may have no pip at all (uv, Poetry and pdm make
them without it): so both tools' settings are read here, the way each tool reads them, and each
tool is handed what the other one knows. pip: ``PIP_INDEX_URL``, ``PIP_EXTRA_INDEX_URL``,
``PIP_FIND_LINKS``, then its config files (``PIP_CONFIG_FILE``, /etc/xdg/pip/pip.conf,
/etc/pip.conf, ~/.pip/pip.conf, ~/.config/pip/pip.conf, the environment's pip.conf). uv:
``UV_DEFAULT_INDEX``/``UV_INDEX_URL``, ``UV_INDEX``, ``UV_EXTRA_INDEX_URL``, ``UV_FIND_LINKS``,
then ``UV_CONFIG_FILE`` or the project's uv.toml / pyproject.toml ``[tool.uv]`` (from the working
directory up), the user's and the system's uv.toml; a named index's ``UV_INDEX_<NAME>_USERNAME``
and ``_PASSWORD`` become its URL's credentials. The URLs may hold ``user:token@``: they are for
the tools' environments only, never a command line or a record.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit


@dataclass(frozen=True, slots=True)
class Settings:
    """One tool's package sources: the index that replaces PyPI ("" for PyPI itself), the extra
    indexes, and the find-links (folders or pages of wheels)."""

    default: str = ""
    extra: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()


def unique(*lists: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(u for urls in lists for u in urls if u))


# -- pip -------------------------------------------------------------------------------------------
def pip_config_files(env: Mapping[str, str]) -> list[Path]:
    """pip's config files, lowest precedence first (pip's configuration.py and appdirs)."""
    chosen = env.get("PIP_CONFIG_FILE")
    if chosen == os.devnull:  # pip: no config file at all
        return []
    dirs = (env.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(os.pathsep)
    files = [*(Path(d, "pip", "pip.conf") for d in dirs if d), Path("/etc/pip.conf")]
    if not (chosen and os.path.exists(chosen)):  # a PIP_CONFIG_FILE that exists hides the user's
        home = Path(env.get("HOME") or os.path.expanduser("~"))
        files += [home / ".pip" / "pip.conf",
                  Path(env.get("XDG_CONFIG_HOME") or home / ".config", "pip", "pip.conf")]
    files.append(Path(sys.prefix, "pip.conf"))
    if chosen:
        files.append(Path(chosen))
    return files


def pip_config(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """pip's settings from its config files, as ``pip install`` sees them: [global], then
    [install] over it; later files over earlier ones. Key names as pip spells them (index-url)."""
    import configparser

    env = os.environ if env is None else env
    out: dict[str, str] = {}
    for path in pip_config_files(env):
        parser = configparser.RawConfigParser()
        try:
            parser.read(path, encoding="utf-8")
        except (OSError, UnicodeDecodeError, configparser.Error):
            continue  # pip would stop on a broken file; the resolution says what is missing
        for section in ("global", "install"):
            if parser.has_section(section):
                out.update({k.lower().replace("_", "-"): v for k, v in parser.items(section)})
    return out


def pip_settings(env: Mapping[str, str] | None = None) -> Settings:
    """What pip is configured with here: its environment over its config files."""
    env = os.environ if env is None else env
    conf = pip_config(env)

    def setting(name: str) -> str:
        return env.get("PIP_" + name.upper().replace("-", "_")) or conf.get(name, "")

    return Settings(setting("index-url").strip(), unique(setting("extra-index-url").split()),
                    unique(setting("find-links").split()))


# -- uv --------------------------------------------------------------------------------------------
def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def uv_config_files(env: Mapping[str, str], cwd: Path | None = None) -> list[tuple[Path, bool]]:
    """uv's config files, highest precedence first, each with whether it is a pyproject.toml
    (settings under [tool.uv]): the project's, the user's, the system's; or UV_CONFIG_FILE alone."""
    if _truthy(env.get("UV_NO_CONFIG")):
        return []
    if env.get("UV_CONFIG_FILE"):
        return [(Path(env["UV_CONFIG_FILE"]), False)]
    found: list[tuple[Path, bool]] = []
    here = (cwd or Path.cwd()).resolve()
    for folder in (here, *here.parents):  # the nearest uv.toml, or pyproject.toml with [tool.uv]
        if (folder / "uv.toml").is_file():
            found.append((folder / "uv.toml", False))
            break
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file() and _uv_table(pyproject, True) is not None:
            found.append((pyproject, True))
            break
    home = Path(env.get("HOME") or os.path.expanduser("~"))
    found.append((Path(env.get("XDG_CONFIG_HOME") or home / ".config", "uv", "uv.toml"), False))
    dirs = [d for d in (env.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(os.pathsep) if d]
    system = [p for p in (*(Path(d, "uv", "uv.toml") for d in dirs), Path("/etc/uv/uv.toml")) if p.is_file()]
    found += [(p, False) for p in system[:1]]
    return [(p, pyproject) for p, pyproject in found if p.is_file()]


def _uv_table(path: Path, pyproject: bool) -> dict[str, Any] | None:
    import tomllib

    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None  # uv itself says what is wrong with the file when it runs
    table = data.get("tool", {}).get("uv") if pyproject else data
    return table if isinstance(table, dict) else None


def _named(value: str) -> tuple[str, str]:
    """uv's ``name=url`` form of an index (``UV_INDEX``, ``--index``): (name, url)."""
    m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)=(.+)$", value)
    if m and "://" not in m[1]:
        return m[1], m[2]
    return "", value


def _with_credentials(url: str, name: str, env: Mapping[str, str]) -> str:
    """A named index's URL with the credentials uv would use for it (UV_INDEX_<NAME>_USERNAME,
    _PASSWORD), for a tool that only knows URLs (pip)."""
    if not name:
        return url
    key = re.sub(r"[^A-Z0-9]", "_", name.upper())
    user, password = env.get(f"UV_INDEX_{key}_USERNAME"), env.get(f"UV_INDEX_{key}_PASSWORD")
    if not (user or password):
        return url
    parts = urlsplit(url)
    if not parts.netloc or "@" in parts.netloc:
        return url
    auth = quote(user or "", safe="") + (":" + quote(password, safe="") if password else "")
    return urlunsplit(parts._replace(netloc=f"{auth}@{parts.netloc}"))


def _listed(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value] if isinstance(value, list) else []


def _from_files(env: Mapping[str, str], cwd: Path | None) -> Iterator[tuple[str, str, str]]:
    """(kind, name, url) of every source uv's config files name, highest precedence first; kind
    is default, index, extra or link."""
    for path, pyproject in uv_config_files(env, cwd):
        table = _uv_table(path, pyproject)
        if table is None:
            continue
        pip = table.get("pip")
        if not isinstance(pip, dict):
            pip = {}
        for entry in table.get("index") or []:
            if not isinstance(entry, dict) or not entry.get("url") or entry.get("explicit"):
                continue  # an explicit index serves only packages pinned to it in a project
            yield ("default" if entry.get("default") else "index"), str(entry.get("name") or ""), str(entry["url"])
        for key, kind in (("index-url", "default"), ("extra-index-url", "extra"), ("find-links", "link")):
            # uv's pip interface reads [pip] over the top level.
            for url in _listed(pip.get(key) if key in pip else table.get(key)):
                yield kind, "", url


def uv_settings(env: Mapping[str, str] | None = None, cwd: Path | None = None) -> Settings:
    """What uv is configured with here: its environment over its config files."""
    env = os.environ if env is None else env
    defaults: list[str] = []
    extra: list[str] = []
    links: list[str] = []
    for value in (env.get("UV_DEFAULT_INDEX"), env.get("UV_INDEX_URL")):
        if value and value.strip():
            name, url = _named(value.strip())
            defaults.append(_with_credentials(url, name, env))
    for value in (env.get("UV_INDEX") or "").split():
        name, url = _named(value)
        extra.append(_with_credentials(url, name, env))
    extra += (env.get("UV_EXTRA_INDEX_URL") or "").split()
    links += [u.strip() for u in re.split(r"[,\s]+", env.get("UV_FIND_LINKS") or "") if u.strip()]
    for kind, name, url in _from_files(env, cwd):
        url = _with_credentials(url, name, env)
        {"default": defaults, "index": extra, "extra": extra, "link": links}[kind].append(url)
    return Settings(defaults[0] if defaults else "", unique(extra), unique(links))


# -- both ------------------------------------------------------------------------------------------
def combined(indexes: Iterable[str] = (), env: Mapping[str, str] | None = None) -> Settings:
    """Every source either tool is configured with here, plus ``indexes`` (a pool's own), for a
    tool to see what the other sees. uv's default index wins over pip's (which becomes an extra
    one); uv's are named before pip's."""
    uv, pip = uv_settings(env), pip_settings(env)
    default = uv.default or pip.default
    displaced = [pip.default] if pip.default and pip.default != default else []
    return Settings(default, unique(indexes, uv.extra, pip.extra, displaced), unique(uv.find_links, pip.find_links))
