"""mkdocs hooks: the parts of the site that are generated at build time, so they cannot go stale.

* the navigation, from the pages that exist (a guide that another change adds shows up in the
  nav by itself; a guide that is not there yet cannot break ``mkdocs build --strict``);
* the API reference, one section per module, from ``skyward.__all__``;
* the CLI reference, from the ``skyward`` command's own argparse parser;
* the module map, from the docstrings of the modules in the source tree.

Also imported by tests/docs/ (``api_groups``, ``cli_markdown``), so keep it free of mkdocs
imports at module level.
"""

from __future__ import annotations

import argparse
import inspect
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent

# Guides in reading order; a guide not listed here comes after these, alphabetically.
GUIDE_ORDER = [
    "operators",
    "images-and-bootstrap",
    "accelerators",
    "gpus",
    "collections-and-streaming",
    "storage",
    "ssh",
    "containers",
    "clouds",
    "named-pools",
    "ttl-and-teardown",
    "healing",
    "serving",
    "reproducing",
    "plugins",
    "observability",
    "dashboard",
    "benchmarks",
]

# Top-level pages in reading order (those present); other top-level pages follow them.
TOP_ORDER = ["index.md", "getting-started.md", "how-it-works.md"]

# Where a public name is defined -> the API reference section it goes in. A module not listed
# here gets a section of its own, titled with the module's name.
API_SECTIONS: dict[str, tuple[str, str]] = {
    # module: (page slug, title)
    "skyward.runtime.collections": ("collections", "Collections"),
    "skyward.core.function": ("functions-and-pools", "Functions and pools"),
    "skyward.observe.app": ("functions-and-pools", "Functions and pools"),
    "skyward.core.membership": ("functions-and-pools", "Functions and pools"),
    "skyward.core.compute": ("functions-and-pools", "Functions and pools"),
    "skyward.core.pool": ("functions-and-pools", "Functions and pools"),
    "skyward.spec": ("specs", "Specs, images and options"),
    "skyward.typing": ("specs", "Specs, images and options"),
    "skyward.volumes": ("storage", "Storage and volumes"),
    "skyward.storage": ("storage", "Storage and volumes"),
    "skyward.health": ("healing", "Healing"),
    "skyward.core.healing": ("healing", "Healing"),
    "skyward.accelerators": ("specs", "Specs, images and options"),
    "skyward.time": ("specs", "Specs, images and options"),
    "skyward.catalogue": ("providers", "Providers and offers"),
    "skyward.providers": ("providers", "Providers and offers"),
    "skyward.runtime": ("inside-tasks", "Inside tasks"),
    "skyward.observe.events": ("observability", "Events, metrics, logging"),
    "skyward.metrics": ("observability", "Events, metrics, logging"),
    "skyward.observe.logs": ("observability", "Events, metrics, logging"),
    "skyward.observe.secrets": ("observability", "Events, metrics, logging"),
    "skyward.plugins": ("plugins", "Plugins"),
    "skyward.serve": ("serving", "Serving"),
    "skyward.errors": ("errors", "Errors"),
}


# API sections in reading order; any other section comes after these, alphabetically.
API_ORDER = ["functions-and-pools", "specs", "providers", "inside-tasks", "collections",
             "plugins", "observability", "storage", "healing", "serving", "errors"]


def _api_order(key: tuple[str, str]) -> tuple[int, str]:
    slug, title = key
    return (API_ORDER.index(slug) if slug in API_ORDER else len(API_ORDER), title)


def _section(module: str) -> tuple[str, str]:
    for prefix, section in API_SECTIONS.items():
        if module == prefix or module.startswith(prefix + "."):
            return section
    if module.startswith("skyward.providers."):
        return API_SECTIONS["skyward.catalogue"]
    slug = module.removeprefix("skyward.").replace(".", "-").replace("_", "-")
    return slug, f"skyward.{module.removeprefix('skyward.')}"


def _static_imports() -> dict[str, str]:
    """Public name -> the module ``skyward/__init__.py`` takes it from, read from its source:
    for values (type aliases, instances) that do not know where they were defined."""
    import ast

    tree = ast.parse((ROOT / "skyward" / "__init__.py").read_text(encoding="utf-8"))
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            for alias in node.names:
                found[alias.asname or alias.name] = f"skyward.{node.module}"
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            for k, v in zip(node.value.keys, node.value.values, strict=True):
                if (isinstance(k, ast.Constant) and isinstance(v, ast.Constant)
                        and isinstance(v.value, str) and v.value.startswith("skyward.")):
                    found.setdefault(k.value, v.value)
    return found


def _definition(name: str, obj: Any, static: dict[str, str]) -> tuple[str, str] | None:
    """(module, dotted path mkdocstrings can find in the source) of a public name."""
    if inspect.ismodule(obj):
        return obj.__name__, obj.__name__
    if inspect.isclass(obj):
        return obj.__module__, f"{obj.__module__}.{obj.__qualname__}"
    if inspect.isfunction(inspect.unwrap(obj)):
        # The name the source defines it under: a function renamed at import time
        # (``make_barrier`` exported as ``barrier``) keeps its code's qualified name.
        fn = inspect.unwrap(obj)
        return fn.__module__, f"{fn.__module__}.{fn.__code__.co_qualname}"
    module = static.get(name)
    if module is None:
        return None
    return module, f"{module}.{name}"


def api_groups() -> dict[tuple[str, str], list[tuple[str, str]]]:
    """(slug, title) -> [(public name, dotted path of its definition)], in __all__ order.

    Names whose definition cannot be located (``__version__``) are left out."""
    import skyward

    static = _static_imports()
    groups: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for name in skyward.__all__:
        found = _definition(name, getattr(skyward, name), static)
        if found is None or name.startswith("__"):
            continue
        module, path = found
        groups.setdefault(_section(module), []).append((name, path))
    return groups


def _options(name: str) -> list[str]:
    """Per-object mkdocstrings options: a class built from mixins of ours shows their methods."""
    import skyward

    obj = getattr(skyward, name)
    if not inspect.isclass(obj) or issubclass(obj, BaseException):
        return []
    ours = [b for b in obj.__mro__[1:] if b.__module__.startswith("skyward.")]
    return ["      inherited_members: true"] if ours else []


def _summary(name: str) -> str:
    import skyward

    obj = getattr(skyward, name)
    # A class's own docstring only: not one inherited from a base (pydantic's BaseModel).
    doc = inspect.cleandoc(obj.__dict__.get("__doc__") or "") if isinstance(obj, type) else (
        inspect.getdoc(obj) or "")
    first = doc.strip().split("\n\n")[0].replace("\n", " ").strip()
    return first.replace("|", "\\|")


def api_pages() -> dict[str, str]:
    """Relative path under docs/ -> Markdown, for the API reference."""
    groups = api_groups()
    order = sorted(groups, key=_api_order)
    index = [
        "# API reference",
        "",
        "Everything public is in `skyward/__init__.py` and is used as `sky.NAME` after "
        "`import skyward as sky`. These pages are generated from that module's `__all__` and "
        "the docstrings each time the site is built.",
        "",
    ]
    pages: dict[str, str] = {}
    seen: dict[str, str] = {}
    for slug, title in order:
        names = groups[slug, title]
        index += [f"## [{title}]({slug}.md)", "", "| name | what it is |", "|---|---|"]
        body = [f"# {title}", ""]
        for name, path in names:
            if path in seen:  # another name for an object documented already
                index.append(f"| `sky.{name}` | the same object as [`sky.{seen[path]}`][{path}] |")
                continue
            seen[path] = name
            index.append(f"| [`sky.{name}`][{path}] | {_summary(name)} |")
            body += [
                f"::: {path}",
                "    options:",
                f"      heading: \"sky.{name}\"",
                f"      toc_label: \"sky.{name}\"",
                *_options(name),
                "",
            ]
        index.append("")
        pages[f"reference/api/{slug}.md"] = "\n".join(body)
    pages["reference/api/index.md"] = "\n".join(index)
    return pages


# -- CLI reference -------------------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _option_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        if action.option_strings:
            flag = ", ".join(action.option_strings)
            if action.nargs != 0:
                flag += f" {action.metavar or action.dest.upper()}"
        else:
            flag = str(action.metavar or action.dest)
        text = (action.help or "").replace("|", "\\|")
        if action.choices and not isinstance(action, argparse._SubParsersAction):
            text += f" (one of: {', '.join(map(str, action.choices))})"
        rows.append(f"| `{flag}` | {text} |")
    return rows


def _usage(parser: argparse.ArgumentParser) -> str:
    """argparse's usage, wrapped at 88 columns whatever the terminal building the site."""
    formatter = argparse.HelpFormatter(parser.prog, width=88)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups, prefix="")
    return formatter.format_help().strip()


def _command_sections(parser: argparse.ArgumentParser, prefix: str, level: int) -> list[str]:
    """One section per subcommand (and per sub-subcommand, a level deeper)."""
    lines: list[str] = []
    for name, sub in _subcommands(parser).items():
        lines += [
            f"{'#' * level} `{prefix} {name}`",
            "",
            sub.description or "",
            "",
            "```text",
            _usage(sub),
            "```",
            "",
            "| argument | meaning |",
            "|---|---|",
            *_option_rows(sub),
            "",
            *_command_sections(sub, f"{prefix} {name}", min(level + 1, 6)),
        ]
    return lines


def cli_markdown() -> str:
    """The CLI reference page, from ``skyward.named.cli``'s parser."""
    from skyward.named import cli

    parser = cli._parser()
    lines = [
        "# CLI reference",
        "",
        "Generated from the `skyward` command's own parser each time the site is built. "
        "See [Named pools and the CLI](../guides/named-pools.md) for a walk-through.",
        "",
        "```text",
        _usage(parser),
        "```",
        "",
        parser.description or "",
        "",
        parser.epilog or "",
        "",
        "| option | meaning |",
        "|---|---|",
        *_option_rows(parser),
        "",
    ]
    lines += _command_sections(parser, "skyward", level=2)
    return "\n".join(lines)


# -- module map ----------------------------------------------------------------------------

ROOT = DOCS.parent
MODULE_FOLDERS = [
    ("skyward", "the public API, pools, specs, events, the CLI"),
    ("skyward/runtime", "helpers used inside running tasks"),
    ("skyward/plugins", "the Plugin type and the built-in plugins"),
    ("providers", "one module per provider (installs as skyward.providers)"),
    ("bootstrap", "what runs on nodes, and the client's end of it (skyward.bootstrap)"),
    ("stacks", "Pulumi stacks for cloud pools (skyward.stacks)"),
]


def modules_markdown(root: Path = ROOT) -> str:
    """Every module of the package with the first line of its docstring, folder by folder."""
    import ast

    lines = [
        "# Module map",
        "",
        "Every module, with the first line of its docstring; generated from the source each time "
        "the site is built. [How it works](../how-it-works.md) follows one call through them.",
        "",
    ]
    for folder, what in MODULE_FOLDERS:
        path = root / folder
        if not path.is_dir():
            continue
        lines += [f"## `{folder}/`: {what}", "", "| module | purpose |", "|---|---|"]
        for file in sorted(path.glob("*.py")):
            try:
                doc = ast.get_docstring(ast.parse(file.read_text(encoding="utf-8"))) or ""
            except SyntaxError:
                doc = ""
            first = doc.strip().split("\n\n")[0].replace("\n", " ").replace("|", "\\|")
            lines.append(f"| `{folder}/{file.name}` | {first} |")
        lines.append("")
    return "\n".join(lines)


# -- navigation ----------------------------------------------------------------------------


def _title(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].replace("`", "").strip()
    return path.stem.replace("-", " ").capitalize()


def _guide_order(stems: list[str]) -> list[str]:
    """Known guides in GUIDE_ORDER; a guide named after one (``named-pools-troubleshooting``)
    right after it; any other guide at the end, alphabetically."""
    known = [g for g in GUIDE_ORDER if g in stems]
    rest = sorted(set(stems) - set(known))
    order: list[str] = []
    for g in known:
        order.append(g)
        order += [r for r in rest if r.startswith(g + "-")]
    return order + [r for r in rest if r not in order]


def build_nav(docs: Path = DOCS, api_slugs: list[tuple[str, str]] | None = None) -> list[Any]:
    """The nav, from the Markdown files present under ``docs``."""
    top = [p.name for p in sorted(docs.glob("*.md"))]
    top_sorted = [n for n in TOP_ORDER if n in top] + [n for n in top if n not in TOP_ORDER]
    guides = {p.stem: p for p in sorted((docs / "guides").glob("*.md"))}
    guide_names = _guide_order(list(guides))

    nav: list[Any] = []
    for n in top_sorted:
        if n == "how-it-works.md":
            continue  # after the guides
        nav.append({_title(docs / n): n} if n != "index.md" else {"Home": n})
    if guide_names:
        nav.append({"Guides": [{_title(guides[g]): f"guides/{g}.md"} for g in guide_names]})
    if "how-it-works.md" in top:
        nav.append({_title(docs / "how-it-works.md"): "how-it-works.md"})
    api: list[Any] = [{"Overview": "reference/api/index.md"}]
    api += [{title: f"reference/api/{slug}.md"} for slug, title in api_slugs or []]
    reference: list[Any] = [{"Python API": api}, {"CLI": "reference/cli.md"}]
    reference.append({"Module map": "reference/modules.md"})
    # Hand-written reference pages (docs/reference/*.md), if any.
    for p in sorted((docs / "reference").glob("*.md")) if (docs / "reference").is_dir() else []:
        if p.name not in ("cli.md", "modules.md"):
            reference.append({_title(p): f"reference/{p.name}"})
    nav.append({"Reference": reference})
    # Any other page in a sub-folder (not guides/, not reference/) still gets a place.
    others = [
        p for p in sorted(docs.glob("*/**/*.md"))
        if p.relative_to(docs).parts[0] not in ("guides", "reference")
    ]
    if others:
        nav.append({"More": [{_title(p): str(p.relative_to(docs))} for p in others]})
    return nav


# -- mkdocs hooks --------------------------------------------------------------------------

_PAGES: dict[str, str] = {}


def on_config(config: Any) -> Any:
    _PAGES.clear()
    _PAGES.update(api_pages())
    _PAGES["reference/cli.md"] = cli_markdown()
    _PAGES["reference/modules.md"] = modules_markdown()
    slugs = sorted(
        {(p.split("/")[-1].removesuffix(".md"), _first_heading(text))
         for p, text in _PAGES.items()
         if p.startswith("reference/api/") and not p.endswith("index.md")},
        key=_api_order,
    )
    config["nav"] = build_nav(Path(config["docs_dir"]), slugs)
    return config


def _first_heading(text: str) -> str:
    return text.split("\n", 1)[0].removeprefix("# ").strip()


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for path, text in _PAGES.items():
        existing = files.get_file_from_path(path)
        if existing is not None:
            files.remove(existing)
        files.append(File.generated(config, path, content=text))
    return files
