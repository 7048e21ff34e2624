"""No import cycles among the project's modules, the pool's parts depend one way, and
node code imports nothing of the client's parts.

A cycle means two modules cannot be understood, tested or loaded one without the other, and
Python hands one of them a half-initialised module when the order of first imports changes.
The graph here counts every import statement of a module, wherever it stands: at the top, or
inside a function (a lazy import delays the dependency, it does not remove it). Only imports
under ``if TYPE_CHECKING:`` are left out: they never run.

Module names are the installed ones: ``stacks/``, ``providers/`` and ``bootstrap/`` install as
``skyward.stacks`` etc. (``skyward/`` reaches them through symlinks, which are not walked
twice). ``import skyward`` and ``from skyward import name`` (a name that is not a submodule,
e.g. ``__version__``) depend on the package itself, whose ``__init__`` imports the public API:
a module below the API that does so is in a cycle with it.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# folder -> the package it installs as
PACKAGES = {
    ROOT / "skyward": "skyward",
    ROOT / "stacks": "skyward.stacks",
    ROOT / "providers": "skyward.providers",
    ROOT / "bootstrap": "skyward.bootstrap",
}

HOW_TO_FIX = """\
Each cycle above is a group of modules that import one another, directly or through each other
(lazy imports inside functions count). Break it at the edge that points the wrong way:
  * move the shared thing (a helper, a constant, a type) down into a small module that both
    import and that imports neither;
  * pass it in (a parameter, a callback, a factory registered by the higher layer) instead of
    importing the higher module from the lower one;
  * if the import is only for annotations, put it under `if TYPE_CHECKING:`.
Do not hide an edge from this test (importlib.import_module with a string) to pass it: the
dependency would still be there, only unseen."""

Edges = dict[str, dict[str, list[int]]]  # module -> imported module -> line numbers


def modules(packages: dict[Path, str]) -> dict[str, tuple[Path, bool]]:
    """Installed module name -> (file, is a package's __init__)."""
    found: dict[str, tuple[Path, bool]] = {}
    for folder, package in packages.items():
        # os.walk does not enter symlinked folders: skyward/stacks is walked as stacks/ only.
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for filename in sorted(filenames):
                if not filename.endswith(".py"):
                    continue
                path = Path(dirpath, filename)
                parts = list(path.relative_to(folder).with_suffix("").parts)
                is_package = parts[-1] == "__init__"
                if is_package:
                    parts.pop()
                found[".".join([package, *parts])] = (path, is_package)
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: anywhere, but not under `if TYPE_CHECKING:`."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, ast.If) and _type_checking(child):
            for other in child.orelse:
                yield from _imports_of(other)
            continue
        yield from _imports_of(child)


def _imports_of(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node
    yield from _imports(node)


def import_graph(packages: dict[Path, str]) -> tuple[dict[str, tuple[Path, bool]], Edges]:
    mods = modules(packages)

    def nearest(name: str) -> str | None:
        """The module that ``import name`` runs: itself, else its nearest package of ours."""
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: Edges = {}
    for name, (path, is_package) in mods.items():
        here = name.split(".") if is_package else name.split(".")[:-1]
        deps: dict[str, list[int]] = {}
        for node in _imports(ast.parse(path.read_text(), str(path))):
            targets: list[str | None] = []
            if isinstance(node, ast.Import):
                targets = [nearest(alias.name) for alias in node.names]
            else:
                if node.level:
                    base = here[: len(here) - (node.level - 1)]
                    module = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    module = node.module or ""
                # `from pkg import sub` imports the submodule; `from pkg import name` the package.
                targets = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in mods else nearest(module)
                           for alias in node.names]
            for target in targets:
                if target is not None and target != name:
                    lines = deps.setdefault(target, [])
                    if node.lineno not in lines:
                        lines.append(node.lineno)
        graph[name] = deps
    return mods, graph


def cycles(graph: Edges) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, {})):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found, key=lambda c: (-len(c), c))


def report(mods: dict[str, tuple[Path, bool]], graph: Edges, found: list[list[str]], root: Path) -> str:
    lines = [f"{len(found)} import cycle(s) among the project's modules:"]
    for component in found:
        members = set(component)
        lines.append(f"\n{len(component)} modules: {', '.join(component)}")
        for v in component:
            path = mods[v][0]
            where = path.relative_to(root) if path.is_relative_to(root) else path
            for w in sorted(set(graph[v]) & members):
                at = ", ".join(str(n) for n in graph[v][w])
                lines.append(f"  {v} -> {w}    ({where}: line {at})")
    return "\n".join([*lines, "", HOW_TO_FIX])


def test_no_import_cycles() -> None:
    mods, graph = import_graph(PACKAGES)
    # A walker that finds nothing would pass vacuously (97 modules when this test was written).
    assert len(mods) > 90, f"only {len(mods)} modules found under {', '.join(map(str, PACKAGES))}"
    assert "skyward.stacks.engine" in mods and "skyward.providers.local" in mods
    assert "skyward.bootstrap.agent" in mods
    found = cycles(graph)
    assert not found, report(mods, graph, found, ROOT)


def test_the_checker_finds_a_cycle(tmp_path: Path) -> None:
    """A tiny package with a cycle through a lazy import and a package import: both are found;
    imports under TYPE_CHECKING and plain standard-library imports are not edges."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from .a import A\n",
        "a.py": "import os\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from .c import C\n\n"
                "class A:\n    def b(self):\n        from .sub import b  # lazy: still an edge\n"
                "        return b.B()\n",
        "sub/__init__.py": "",
        "sub/b.py": "from .. import a\n\nclass B: ...\n",
        "c.py": "import pkg.a\n",  # c -> a, but nothing runs c: not in a cycle
        "d.py": "from pkg import VERSION\n",  # the package itself, which imports a
        "e.py": "import pkg.c\n",
    }
    files["a.py"] += "\ndef d():\n    from . import d\n"
    for name, text in files.items():
        (pkg / name).write_text(text)

    mods, graph = import_graph({pkg: "pkg"})
    assert set(mods) == {"pkg", "pkg.a", "pkg.sub", "pkg.sub.b", "pkg.c", "pkg.d", "pkg.e"}
    assert graph["pkg.a"] == {"pkg.sub.b": [9], "pkg.d": [13]}  # not c (TYPE_CHECKING), not os
    assert graph["pkg.sub.b"] == {"pkg.a": [1]}
    assert graph["pkg.d"] == {"pkg": [1]}
    found = cycles(graph)
    assert found == [["pkg", "pkg.a", "pkg.d", "pkg.sub.b"]]
    message = report(mods, graph, found, tmp_path)
    assert "pkg.a -> pkg.sub.b    (pkg/a.py: line 9)" in message
    assert "pkg.d -> pkg    (pkg/d.py: line 1)" in message
    assert "TYPE_CHECKING" in message

    (pkg / "d.py").write_text("VERSION = '1'\n")
    (pkg / "sub" / "b.py").write_text("class B: ...\n")
    assert cycles(import_graph({pkg: "pkg"})[1]) == []



# The pool's parts (docs/how-it-works.md, "The pool's parts"): each core module may import only
# the core modules listed for it. Membership is at the bottom and calls no other part; the pool
# wires them; nothing below the pool imports it.
CORE_MAY_IMPORT = {
    "skyward.core.target": set(),
    "skyward.core.function": {"target"},
    "skyward.core.streaming": set(),
    "skyward.core.membership": set(),
    "skyward.core.dispatch": {"membership", "function", "streaming"},
    "skyward.core.batches": {"dispatch", "function", "streaming"},
    "skyward.core.healing": {"membership", "dispatch"},
    "skyward.core.autoscale": {"membership"},
    "skyward.core.group": {"membership", "dispatch", "batches", "healing", "autoscale", "target"},
    "skyward.core.pool": {"membership", "dispatch", "batches", "healing", "autoscale", "function", "target", "group"},
    "skyward.core.compute": {"pool", "group"},
}


def test_the_pools_parts_depend_one_way() -> None:
    mods, graph = import_graph(PACKAGES)
    core = {m for m in mods if m.startswith("skyward.core.")}
    assert core == set(CORE_MAY_IMPORT), f"core modules changed: {sorted(core ^ set(CORE_MAY_IMPORT))}"
    wrong = []
    for module, allowed in CORE_MAY_IMPORT.items():
        for dep, lines in graph[module].items():
            if dep.startswith("skyward.core.") and dep.removeprefix("skyward.core.") not in allowed:
                wrong.append(f"{module} -> {dep} (line {', '.join(map(str, lines))})")
    # Outside the core, only what opens pools may import the pool itself.
    for module, deps in graph.items():
        if "skyward.core.pool" in deps and module not in {"skyward.core.compute", "skyward.named.pools"}:
            wrong.append(f"{module} -> skyward.core.pool")
    assert not wrong, "imports against the parts' order:\n  " + "\n  ".join(wrong)


# -- What runs on nodes -----------------------------------------------------------------------
# The agent's process and its workers start from these modules (`python -m`, the Local pool's
# fork server); every module they import, at the top or inside a function, runs on nodes too.
NODE_ENTRIES = (
    "skyward.bootstrap.agent_start",
    "skyward.bootstrap.agent",
    "skyward.bootstrap.supervisor",
    "skyward.bootstrap.worker",
    "skyward.bootstrap.zygote",
)
# Node code imports the standard library, cloudpickle, lz4 and pydantic, and of ours only its
# own package, the runtime helpers that tasks call, and two small nouns that both ends share:
# the errors (raised on a node, the same type on the client) and the plugin interface (plugins
# are unpickled on nodes; the supervisor renders their launcher hooks). DESIGN.md, "Layout".
NODE_PACKAGES = ("skyward.bootstrap", "skyward.runtime")
NODE_MODULES = frozenset({"skyward.errors", "skyward.plugins.plugin"})
# The client's parts, never imported on a node (a failure names them as such).
CLIENT_SIDE = ("skyward.core", "skyward.named", "skyward.observe", "skyward.records", "skyward.dashboard",
               "skyward.plugins", "skyward.providers", "skyward.stacks")
# Imports in node modules that only ever run on the client, and why: the walk does not follow
# them. Each must still be in the code (when one goes, its line here goes too).
CLIENT_ONLY_EDGES = {
    ("skyward.bootstrap.serialize", "skyward.observe.events"):
        "serialize tells the open pools of its process that CUDA tensors landed on the CPU, as "
        "events; pools are opened on the client, never on a node",
}


def node_side(graph: Edges, entries: tuple[str, ...], skip: set[tuple[str, str]]) -> dict[str, list[str]]:
    """Every module that ``entries`` import, directly or through each other (``skip``: edges
    not followed) -> the chain of imports from an entry that reaches it first."""
    chains = {entry: [entry] for entry in entries}
    queue = list(entries)
    while queue:
        module = queue.pop(0)
        for dep in sorted(graph.get(module, {})):
            if dep not in chains and (module, dep) not in skip:
                chains[dep] = [*chains[module], dep]
                queue.append(dep)
    return chains


def _in(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def node_violations(graph: Edges, chains: dict[str, list[str]]) -> list[str]:
    """The node-side modules that node code may not import, each with how a node gets to it."""
    wrong = []
    for module, chain in sorted(chains.items()):
        if _in(module, NODE_PACKAGES) or module in NODE_MODULES:
            continue
        importer = chain[-2] if len(chain) > 1 else module
        lines = ", ".join(map(str, graph.get(importer, {}).get(module, [])))
        part = ", a client part" if _in(module, CLIENT_SIDE) else ""
        wrong.append(f"{module}{part}: {' -> '.join(chain)} (line {lines} of {importer})")
    return wrong


def test_node_code_imports_nothing_of_the_client() -> None:
    _, graph = import_graph(PACKAGES)
    for (module, dep), why in CLIENT_ONLY_EDGES.items():
        assert dep in graph[module], f"{module} no longer imports {dep}: drop it from CLIENT_ONLY_EDGES ({why})"
    chains = node_side(graph, NODE_ENTRIES, set(CLIENT_ONLY_EDGES))
    # A walk that finds little would pass vacuously.
    for module in ("agent", "supervisor", "worker", "frames", "serialize", "handshake", "shm", "state", "lane"):
        assert f"skyward.bootstrap.{module}" in chains, f"skyward.bootstrap.{module} is not found node-side"
    wrong = node_violations(graph, chains)
    assert not wrong, (
        "node code imports modules of the client's parts (or of ours that nodes do not have a use "
        "for); nodes may import the standard library, cloudpickle, lz4, pydantic, skyward.bootstrap, "
        "skyward.runtime, skyward.errors and skyward.plugins.plugin:\n  " + "\n  ".join(wrong)
        + "\nMove what the node needs down into skyward.bootstrap (or skyward.runtime), or pass it "
        "in from the client's side; never hide the import from this test."
    )


def test_the_node_checker_finds_a_client_import(tmp_path: Path) -> None:
    """A node module that reaches the client's part through a lazy import in another node
    module is found, with the chain; an import under TYPE_CHECKING and a skipped edge are not."""
    root = tmp_path / "skyward"
    for folder in ("bootstrap", "core", "runtime"):
        (root / folder).mkdir(parents=True)
        (root / folder / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "errors.py").write_text("class E(Exception): ...\n")
    files = {
        "bootstrap/agent.py": "from . import helper\nfrom skyward.errors import E\n",
        "bootstrap/helper.py": "import os\n\ndef f():\n    from skyward.runtime import tools\n    return tools\n",
        "runtime/tools.py": "TYPE_CHECKING = False\nif TYPE_CHECKING:\n    from skyward.core import pool\n"
                            "def g():\n    from skyward.core import pool\n    return pool\n",
        "bootstrap/quiet.py": "def h():\n    from skyward.core import pool\n    return pool\n",
        "core/pool.py": "class Pool: ...\n",
    }
    for name, text in files.items():
        (root / name).write_text(text)
    _, graph = import_graph({root: "skyward"})
    entries = ("skyward.bootstrap.agent", "skyward.bootstrap.quiet")
    chains = node_side(graph, entries, {("skyward.bootstrap.quiet", "skyward.core.pool")})
    assert set(chains) == {"skyward.bootstrap.agent", "skyward.bootstrap.quiet", "skyward.bootstrap.helper",
                           "skyward.errors", "skyward.runtime.tools", "skyward.core.pool"}
    assert chains["skyward.core.pool"] == ["skyward.bootstrap.agent", "skyward.bootstrap.helper",
                                           "skyward.runtime.tools", "skyward.core.pool"]
    assert node_violations(graph, chains) == [
        "skyward.core.pool, a client part: skyward.bootstrap.agent -> skyward.bootstrap.helper -> skyward.runtime.tools "
        "-> skyward.core.pool (line 5 of skyward.runtime.tools)"
    ]
    (root / "runtime" / "tools.py").write_text("def g():\n    return 1\n")
    _, graph = import_graph({root: "skyward"})
    assert node_violations(graph, node_side(graph, entries, set())) == [
        "skyward.core.pool, a client part: skyward.bootstrap.quiet -> skyward.core.pool (line 2 of skyward.bootstrap.quiet)"
    ]
