"""Every ```python block in README.md and docs/ runs, and every documented ``sky.NAME`` exists.

A block runs as a script of its own (``python block.py`` in an empty folder), the way a reader
would paste it, on ``sky.Local()`` unless it says otherwise. The line before a block may say:

* ``<!-- not-runnable: <reason> -->``: the block is not run (the reason is required and shown
  in the skip message), e.g. it needs SSH hosts or cloud credentials.
* ``<!-- continues -->``: the block runs after the page's previous runnable block, in the same
  script, for guides that build an example up step by step.

A block that names ``sky.AWS(`` or ``sky.GCP(`` runs as a preview: each ``with
sky.Compute(...)`` statement in it is replaced by a preview of the pool it describes (the real
stack program under Pulumi's mocks, see ``provider.preview``), so its arguments, the offer
choice and the stack program are all checked while nothing is created and the body is not run.

A block that names ``sky.SSH(`` runs on the suite's real ``sshd`` test hosts
(tests/sshhosts.py): each ``sky.SSH(...)`` call is replaced by a provider over three fresh test
hosts, so everything else in the block (the Image, the bootstrap, the tasks) runs for real.

A block that needs a package which comes only from beyond PyPI (the one index the README's
install uses), torch above all, runs only where that package is installed already: otherwise its
pool would fetch it from there (the torch plugin: PyTorch's own index), which a fresh machine may
not reach. It skips, saying so.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import skyward as sky

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]

NOT_RUNNABLE = re.compile(r"^<!--\s*not-runnable:\s*(?P<reason>.*?)\s*-->$")
CONTINUES = re.compile(r"^<!--\s*continues\s*-->$")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")
CLOUD = re.compile(r"\bsky\.(AWS|GCP)\(")
SSH = re.compile(r"\bsky\.SSH\(")
SSH_HOSTS_ENV = "SKYWARD_DOCS_SSH_HOSTS"


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    marker: str  # the non-blank line before the fence ("" if none)

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page (any language), in order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent = m["fence"], len(m["indent"])
        before = next((ln.strip() for ln in reversed(lines[:i]) if ln.strip()), "")
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][indent:] if lines[i][:indent].isspace() else lines[i])
            i += 1
        found.append(Block(page, start + 1, m["lang"].lower(), "\n".join(body) + "\n", before))
        i += 1
    return found


def python_blocks() -> list[Block]:
    return [b for page in PAGES for b in blocks(page) if b.lang in ("python", "py", "python3")]


def runnable() -> list[tuple[Block, str]]:
    """(block, the script that runs it) for every block that is not marked not-runnable."""
    out: list[tuple[Block, str]] = []
    previous: dict[Path, str] = {}
    for block in python_blocks():
        if NOT_RUNNABLE.match(block.marker):
            continue
        code = block.code
        if CONTINUES.match(block.marker):
            if block.page not in previous:
                raise AssertionError(f"{block.id}: <!-- continues --> but no runnable block before it")
            code = previous[block.page] + "\n" + code
        previous[block.page] = code
        out.append((block, code))
    return out


# -- running ---------------------------------------------------------------------------------

_PREVIEW_PRELUDE = '''
def _docs_preview(compute):
    """Stands in for `with sky.Compute(...)` in cloud examples: preview, create nothing."""
    from skyward.spec import select_spec as _select

    spec = _select(compute.specs, compute.options)
    plan = spec.provider.preview(spec)
    print(f"preview: {len(plan['resources'])} resources on {plan['offer']}")
    assert plan["resources"], plan
'''


def _is_compute(node: ast.expr) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "Compute" and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "sky")


class _PreviewPools(ast.NodeTransformer):
    def visit_With(self, node: ast.With) -> ast.AST:
        calls = [item.context_expr for item in node.items if _is_compute(item.context_expr)]
        if not calls:
            return self.generic_visit(node)
        return [ast.Expr(ast.Call(ast.Name("_docs_preview", ast.Load()), [c], [])) for c in calls]


def as_preview(code: str) -> str:
    tree = _PreviewPools().visit(ast.parse(code))
    return _PREVIEW_PRELUDE + "\n" + ast.unparse(ast.fix_missing_locations(tree)) + "\n"


_SSH_PRELUDE = f'''
def _docs_ssh_hosts():
    """Stands in for `sky.SSH(...)`: the test suite's sshd hosts, from ${SSH_HOSTS_ENV}."""
    import json
    import os

    import skyward as sky

    hosts = json.loads(os.environ["{SSH_HOSTS_ENV}"])
    return sky.SSH(hosts=[sky.SSHHost(**h) for h in hosts])
'''


class _TestHosts(ast.NodeTransformer):
    def visit_Call(self, node: ast.Call) -> ast.AST:
        if (isinstance(node.func, ast.Attribute) and node.func.attr == "SSH"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "sky"):
            return ast.Call(ast.Name("_docs_ssh_hosts", ast.Load()), [], [])
        return self.generic_visit(node)


def on_test_hosts(code: str) -> str:
    tree = _TestHosts().visit(ast.parse(code))
    return _SSH_PRELUDE + "\n" + ast.unparse(ast.fix_missing_locations(tree)) + "\n"


# Packages that come only from beyond PyPI: import name -> where a pool would fetch it.
BEYOND_PYPI = {
    "torch": "PyTorch's own index (download.pytorch.org), where the torch plugin gets it",
    "cuml": "NVIDIA's index (pypi.nvidia.com), where the cuml plugin gets it",
}
# Plugins that bring one of them: sky.plugins.NAME( -> import name.
PLUGINS_BEYOND_PYPI = {"torch": "torch", "cuml": "cuml"}
PLUGIN_CALL = re.compile(r"\bsky\.plugins\.(\w+)\(")


def beyond_pypi(code: str) -> set[str]:
    """The packages of BEYOND_PYPI that a block imports (at any depth) or that its plugins bring."""
    names = {m[1] for m in PLUGIN_CALL.finditer(code)}
    needed = {PLUGINS_BEYOND_PYPI[n] for n in names if n in PLUGINS_BEYOND_PYPI}
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            needed |= {alias.name.partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            needed.add(node.module.partition(".")[0])
    return needed & BEYOND_PYPI.keys()


RUNNABLE = runnable()


@pytest.fixture(scope="module")
def docs_ssh_hosts() -> Iterator[object]:
    """Three fresh sshd test hosts for the SSH examples, started only if one of them runs."""
    from sshhosts import SSHHosts, SSHHostsUnavailable

    hosts = SSHHosts(3)
    try:
        try:
            hosts.start()
        except SSHHostsUnavailable as exc:
            pytest.skip(f"SSH test hosts unavailable: {exc}")
        yield hosts
    finally:
        hosts.close()


def run_example(code: str, folder: Path, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run ``code`` as ``python example.py`` in ``folder``: (exit code, stdout, stderr)."""
    if CLOUD.search(code):
        code = as_preview(code)
    elif SSH.search(code):
        code = on_test_hosts(code)
    script = folder / "example.py"
    script.write_text(code, encoding="utf-8")
    proc = subprocess.Popen(
        [sys.executable, str(script)], cwd=folder, env={**os.environ, **(env or {})}, text=True,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True,  # so that a stuck example is stopped with everything it started
    )
    try:
        # Below pytest's own 120 s timeout, so that a stuck example reports its output.
        stdout, stderr = proc.communicate(timeout=100)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        return -1, stdout, stderr + "\n(killed: still running after 100 s)"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, stdout, stderr


@pytest.mark.parametrize(("block", "code"), RUNNABLE, ids=[b.id for b, _ in RUNNABLE])
def test_example_runs(block: Block, code: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    env: dict[str, str] = {}
    if not CLOUD.search(code):  # a preview runs no task and installs nothing
        for name in sorted(beyond_pypi(code)):
            if importlib.util.find_spec(name) is None:
                pytest.skip(f"{block.id} needs {name}, which is not installed in this venv; its pool would "
                            f"fetch it from {BEYOND_PYPI[name]}, beyond PyPI, which this machine may not reach")
    if CLOUD.search(code):
        pytest.importorskip("pulumi", reason="cloud examples run as previews, which need the pulumi SDK")
    elif SSH.search(code):
        hosts = request.getfixturevalue("docs_ssh_hosts")
        env[SSH_HOSTS_ENV] = json.dumps([
            {"address": h.address, "port": h.port, "user": h.user, "key": str(h.key_path)}
            for h in hosts
        ])
    rc, stdout, stderr = run_example(code, tmp_path, env)
    assert rc == 0, (
        f"{block.id} failed (exit {rc}):\n--- code\n{code}\n--- stdout\n"
        f"{stdout[-3000:]}\n--- stderr\n{stderr[-5000:]}"
    )


def test_a_failing_example_fails(tmp_path: Path) -> None:
    rc, _, stderr = run_example("import skyward as sky\nsky.Compute(nodes='two')\n", tmp_path)
    assert rc != 0 and "ConfigError" in stderr


def test_every_python_block_runs_or_says_why_not() -> None:
    for block in python_blocks():
        m = NOT_RUNNABLE.match(block.marker)
        if m:
            assert m["reason"], f"{block.id}: <!-- not-runnable: --> needs a reason"
        elif block.marker.startswith("<!--") and "not-runnable" in block.marker:
            raise AssertionError(f"{block.id}: malformed marker {block.marker!r}; "
                                 "write <!-- not-runnable: <reason> -->")


def test_blocks_that_need_a_package_from_beyond_pypi_are_recognised() -> None:
    """The torch guide's block is recognised (by its plugin and by its import), others are not."""
    torch_blocks = [code for b, code in RUNNABLE if b.page.name == "plugins.md" and "plugins.torch(" in code]
    assert torch_blocks and all(beyond_pypi(code) == {"torch"} for code in torch_blocks)
    assert beyond_pypi("import skyward as sky\nsky.Compute(plugins=[sky.plugins.torch()])\n") == {"torch"}
    assert beyond_pypi("def f():\n    from torch.nn import Linear\n") == {"torch"}
    assert beyond_pypi("import skyward as sky\nimport sklearn\nsky.plugins.sklearn()\n") == set()


def test_blocks_are_found() -> None:
    """The extractor sees the README's own quickstart block (guards against a silent regex)."""
    readme = [b for b in python_blocks() if b.page.name == "README.md"]
    assert readme and "sky.Compute" in readme[0].code


# -- documented names ------------------------------------------------------------------------

SKY_NAME = re.compile(r"(?<![\w.])sky\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")
SKYWARD_NAME = re.compile(r"(?<![\w./-])skyward\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")
# `skyward.toml` and friends are file names, not modules.
FILE_SUFFIXES = {"toml", "log", "json", "jsonl", "passphrase"}


def _resolve(root: object, dotted: str) -> str | None:
    """None if every part of ``dotted`` exists under ``root``, else the first missing part."""
    obj = root
    for part in dotted.split("."):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        fields = getattr(obj, "__dataclass_fields__", None) or getattr(obj, "model_fields", None)
        annotations = getattr(obj, "__annotations__", {}) if isinstance(obj, type) else {}
        if (fields and part in fields) or part in annotations:
            return None  # a field of a record: no value on the class itself
        if hasattr(obj, "__path__"):  # a package: the part may be a submodule
            try:
                obj = importlib.import_module(f"{obj.__name__}.{part}")
                continue
            except ImportError:
                pass
        return part
    return None


def documented_names() -> dict[str, list[str]]:
    """'sky.X.Y' / 'skyward.x.y' -> where it is mentioned (page:line)."""
    names: dict[str, list[str]] = {}
    for page in PAGES:
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            where = f"{page.relative_to(ROOT)}:{n}"
            for m in SKY_NAME.finditer(line):
                names.setdefault(f"sky.{m[1]}", []).append(where)
            for m in SKYWARD_NAME.finditer(line):
                if m[1].split(".")[0] not in FILE_SUFFIXES:
                    names.setdefault(f"skyward.{m[1]}", []).append(where)
    return names


def test_every_documented_name_exists() -> None:
    import skyward

    missing = []
    for name, where in sorted(documented_names().items()):
        root, _, dotted = name.partition(".")
        part = _resolve(sky if root == "sky" else skyward, dotted)
        if part is not None:
            missing.append(f"{name} (no {part!r}), at {', '.join(where[:3])}")
    assert not missing, "documented names that do not exist:\n" + "\n".join(missing)


def test_name_check_catches_a_missing_name() -> None:
    assert _resolve(sky, "Compute") is None
    assert _resolve(sky, "accelerators.A100") is None
    assert _resolve(sky, "Image.pip") is None  # a dataclass field
    assert _resolve(sky, "NoSuchThing") == "NoSuchThing"
    assert _resolve(sky, "plugins.no_such_plugin") == "no_such_plugin"


def test_preview_rewrite_drops_the_pool_body() -> None:
    code = textwrap.dedent("""
        import skyward as sky
        with sky.Compute(provider=sky.AWS(), nodes=2) as pool:
            undefined_name(pool)
    """)
    out = as_preview(code)
    assert "undefined_name" not in out and "_docs_preview(sky.Compute(provider=sky.AWS(), nodes=2))" in out
