"""``skyward cp``: files and folders between this machine and the nodes of a running named pool.

    skyward cp LOCAL NAME:PATH [--node N]     upload, to every node (or node N)
    skyward cp NAME:PATH LOCAL [--node N]     download; from every node into LOCAL/node-<N>/,
                                              or from node N to LOCAL itself

Like ``cp -r``: folders are copied whole; a destination that is a folder (or ends with ``/``)
receives the source under its own name, any other destination is the copy's name, and missing
parent folders are made. A relative node path starts in the node's working directory (where
its tasks run); ``~`` is the login user's home there. The transfer is a tar stream over the
pool's own connection to each node (nodeaccess.py), with a progress bar on a terminal.

Nothing is half copied where it can be avoided: every node is checked first (a path missing on
any node fails the whole copy, naming the nodes), each node's copy is unpacked into a hidden
folder beside its destination, and only once every node has received all of it are the copies
moved into place.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import re
import shlex
import shutil
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, SkywardError
from .cliout import EXIT_OK, print_json
from .nodeaccess import Node, Process, finish, open_nodes
from .wake import awake

q = shlex.quote
_BAR_FROM = 1 << 20  # copies of at least this many bytes show a progress bar on a terminal
_STAGE = ".skyward-cp-"
_REMOTE = re.compile(r"(?P<name>[a-z0-9][a-z0-9_-]{0,62}):(?P<path>.*)", re.S)  # registry.NAME_RULE


def add_cp(command: Callable[[str], argparse.ArgumentParser]) -> None:
    p = command("cp")  # its help: _MODULE_COMMANDS of named/cli.py
    p.add_argument("source", metavar="SRC", help="LOCAL path or NAME:PATH")
    p.add_argument("dest", metavar="DEST", help="NAME:PATH or LOCAL path")
    p.add_argument("--node", type=int, help="only this node (rank 0 to nodes-1; with --group: its rank "
                   "within the group); default: every node")
    p.add_argument("--group", help="only this group's nodes (a pool of several groups)")
    p.add_argument("--no-wake", action="store_true", help="refuse with an error when the pool is asleep, instead of waking it for this command")
    p.set_defaults(handler=cmd_cp)


@dataclass(frozen=True)
class Endpoint:
    pool: str | None  # None: this machine
    path: str

    def __str__(self) -> str:
        return self.path if self.pool is None else f"{self.pool}:{self.path}"


def parse(word: str) -> Endpoint:
    """``NAME:PATH`` is on a pool's nodes (what a pool may be named, then a colon); anything
    else is here (``./a:b`` for a local name with a colon)."""
    m = _REMOTE.fullmatch(word)
    return Endpoint(m["name"], m["path"]) if m else Endpoint(None, word)


def cmd_cp(args: argparse.Namespace) -> int:
    from ..records import audit

    src, dest = parse(args.source), parse(args.dest)
    if (src.pool is None) == (dest.pool is None):
        raise ConfigError(
            f"cp copies between this machine and a pool's nodes: one of {args.source!r} and "
            f"{args.dest!r} must be NAME:PATH and the other a local path, e.g. `skyward cp data.csv "
            f"demo:` or `skyward cp demo:results .` (a local name with a colon: ./name:x).")
    name = src.pool or dest.pool
    assert name is not None
    if src.pool is None:
        local = Path(src.path).expanduser()
        if not src.path or not (local.exists() or local.is_symlink()):
            raise SkywardError(f"{src.path or repr('')}: no such file or folder here ({os.getcwd()}); nothing "
                               f"was copied.")
    started = time.monotonic()
    with awake(name, wake=not args.no_wake, command="skyward cp", node=args.node), \
            open_nodes(name, args.node, args.group) as (record, nodes):
        if src.pool is None:
            done = upload(Path(src.path), dest.path, nodes, show=_show_bar(args))
        else:
            done = download(src.path, Path(dest.path), nodes, per_node=args.node is None,
                            trailing_slash=dest.path.endswith("/"), show=_show_bar(args))
    seconds = time.monotonic() - started
    audit.append(name, "cp", record.get("id", ""), source=str(src), dest=str(dest),
                 nodes=[d["node"] for d in done], bytes=sum(d["bytes"] for d in done),
                 seconds=round(seconds, 1))
    if args.json:
        print_json(done)
    else:
        for d in done:
            print(f"node {d['node']} ({d['hostname']}): {d['source']} -> {d['target']} ({_size(d['bytes'])})")
    return EXIT_OK


def _show_bar(args: argparse.Namespace) -> bool:
    return sys.stderr.isatty() and not args.json


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


# -- paths on a node ----------------------------------------------------------------------------------
def node_path(path: str) -> str:
    """``path`` as a bash word on the node: relative to the working directory, ``~`` the home."""
    if path == "~" or path.startswith("~/"):
        rest = path[2:]
        return '"$HOME"' + (f"/{q(rest)}" if rest else "")
    return q(path or ".")


def _facts(out: str) -> dict[str, str]:
    facts = {}
    for line in out.splitlines():
        if line.startswith("@@"):
            key, _, value = line[2:].partition(" ")
            facts[key] = value
    return facts


def _in_cwd(node: Node) -> str:
    return f'cd -- {q(node.cwd)} 2>/dev/null || {{ echo "@@nocwd"; exit 0; }}\n'


def _look(node: Node, script: str, path: str, what: str, needed: str) -> dict[str, str] | str:
    """Run a looking ``script`` (in the node's working directory) for ``path``: the ``@@`` facts
    it printed, or why it refused or failed, in words (``needed``: the fact it must print)."""
    code, out, error = node.run(_in_cwd(node) + script)
    facts = _facts(out)
    refused = _node_failure(node, what, facts, path)
    if refused is not None:
        return refused
    if code != 0 or needed not in facts:
        return f"{path}: could not be looked at on {node.label} (exit {code}): {error.strip()[-300:]}"
    return facts


def _node_failure(node: Node, what: str, facts: dict[str, str], path: str) -> str | None:
    """Why a node's check refused, in words (None: it did not)."""
    where = f"on {node.label}"
    if "nocwd" in facts:
        return f"{where}: its working directory {node.cwd} is gone"
    if "missing" in facts:
        return f"{path}: no such file or folder {where} (relative paths start in {node.cwd})"
    if "unreadable" in facts:
        return f"{path}: cannot be read {where} (permission denied)"
    if "isdir" in facts:
        return f"{facts['isdir']}: is a folder {where}, and {what} is a file; give a path inside it"
    if "isfile" in facts:
        return f"{facts['isfile']}: is a file {where}, and {what} is a folder; give another destination"
    if "notdir" in facts:
        return f"{facts['notdir']}: is a file {where}, so no folder can be made there"
    if "unwritable" in facts:
        return f"{facts['unwritable']}: cannot be written {where} (permission denied)"
    return None


def _check_all(nodes: list[Node], check: Callable[[Node], Any]) -> list[Any]:
    """``check`` on every node at once; every node's refusal in one error (nothing copied)."""
    def guarded(node: Node) -> Any:
        try:
            return check(node)
        except SkywardError as exc:
            return str(exc)
        except Exception as exc:  # a connection that broke: this node's answer, not a traceback
            return f"{node.label}: {type(exc).__name__}: {exc}"

    with ThreadPoolExecutor(max_workers=min(32, len(nodes))) as ex:
        answers = list(ex.map(guarded, nodes))
    problems = [a for a in answers if isinstance(a, str)]
    if problems:
        raise SkywardError("; ".join(problems) + ". Nothing was copied.")
    return answers


# -- progress ---------------------------------------------------------------------------------------------
class _Progress:
    """A rich progress bar on stderr for copies of 1 MB or more (nothing otherwise). Threads add
    to it; a node's bytes are taken back when it fails."""

    def __init__(self, label: str, total: int, show: bool) -> None:
        self._bar: Any = None
        self._lock = threading.Lock()
        if show and total >= _BAR_FROM:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TaskProgressColumn,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                                 DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
                                 console=Console(stderr=True))
            self._task = self._bar.add_task(label, total=total)
        self.total, self.done = total, 0

    def __enter__(self) -> _Progress:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            if exc[0] is None:
                self._bar.update(self._task, completed=self.total)
            self._bar.stop()

    def add(self, n: int) -> None:
        with self._lock:
            self.done += n
            if self._bar is not None:
                self._bar.update(self._task, completed=min(self.done, self.total))


class _Counted:
    """A node process's stdout as a file tarfile reads, counting what arrives. It arrives in
    large chunks, served in the small reads tarfile makes."""

    def __init__(self, proc: Process, progress: _Progress, counter: list[int]) -> None:
        self._proc, self._progress, self._counter = proc, progress, counter
        self._buf, self._pos = b"", 0

    def read(self, n: int = -1) -> bytes:
        if self._pos >= len(self._buf):
            self._buf, self._pos = self._proc.read(), 0
            self._counter[0] += len(self._buf)
            self._progress.add(len(self._buf))
        end = len(self._buf) if n < 0 else self._pos + n
        data = self._buf[self._pos:end]
        self._pos += len(data)
        return data


class _Sink:
    """A node process's stdin as a file tarfile writes, counting what it writes."""

    def __init__(self, proc: Process, progress: _Progress, counter: list[int]) -> None:
        self._proc, self._progress, self._counter = proc, progress, counter

    def write(self, data: bytes) -> int:
        self._proc.write(data)
        self._counter[0] += len(data)
        self._progress.add(len(data))
        return len(data)

    def close(self) -> None:
        pass


# -- download ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Found:
    node: Node
    kind: str  # "file" | "dir"
    path: str  # absolute, on the node
    base: str  # the name it is known by
    size: int


def _find(src: str) -> Callable[[Node], _Found | str]:
    script_tail = (
        f"src={node_path(src)}\n"
        'if [ ! -e "$src" ]; then echo "@@missing"; exit 0; fi\n'
        'if [ -d "$src" ]; then\n'
        '  full=$(cd -- "$src" 2>/dev/null && pwd -P) || { echo "@@unreadable"; exit 0; }\n'
        '  base=$(basename -- "$(cd -- "$src" && pwd)"); kind=dir\n'
        'else\n'
        '  base=$(basename -- "$src"); full="$(cd -- "$(dirname -- "$src")" && pwd -P)/$base"; kind=file\n'
        'fi\n'
        '[ -r "$full" ] || { echo "@@unreadable"; exit 0; }\n'
        'echo "@@kind $kind"; echo "@@path $full"; echo "@@base $base"\n'
        'echo "@@size $(find -H "$full" -type f -exec wc -c {} + 2>/dev/null | '
        "awk 'NF == 2 && $2 == \"total\" {next} {s += $1} END {printf \"%.0f\\n\", s}')\"\n"
    )

    def check(node: Node) -> _Found | str:
        facts = _look(node, script_tail, src, "", needed="path")
        if isinstance(facts, str):
            return facts
        if facts["base"] in ("/", ""):
            return f"{src} is the root folder of {node.label}: name a folder inside it"
        return _Found(node, facts["kind"], facts["path"], facts["base"], int(float(facts.get("size") or 0)))

    return check


def download(src: str, dest: Path, nodes: list[Node], *, per_node: bool, trailing_slash: bool,
             show: bool) -> list[dict[str, Any]]:
    found: list[_Found] = _check_all(nodes, _find(src))
    dest = dest.expanduser()
    targets = {}
    for f in found:
        if per_node:  # every node's copy in a folder of its own
            if dest.exists() and not dest.is_dir():
                raise SkywardError(f"{dest}: is a file here; copies from several nodes go into a folder "
                                   f"(DEST/node-<N>/), or pick one node with --node N. Nothing was copied.")
            targets[f.node.rank] = dest / f"node-{f.node.rank}" / f.base
        else:
            targets[f.node.rank] = dest / f.base if dest.is_dir() or trailing_slash else dest
    for f in found:
        _check_local_target(targets[f.node.rank], f.kind)
    total = sum(f.size for f in found)
    label = f"{found[0].base} from {len(found)} node(s)"
    with _staging(list(targets.values())) as stages, _Progress(label, total, show) as bar:
        payloads: dict[int, Path] = {}
        sizes: dict[int, int] = {}
        live: list[Process] = []

        def fetch(f: _Found) -> None:
            stage = stages[targets[f.node.rank]] / f"node-{f.node.rank}"
            stage.mkdir()
            if f.kind == "dir":
                into, payload = stage / "payload", stage / "payload"
                into.mkdir()
                script = f"exec tar -C {q(f.path)} -cf - ."
            else:
                into, payload = stage, stage / f.base
                script = f"exec tar -C {q(os.path.dirname(f.path))} -chf - {q(f.base)}"
            counter = [0]
            proc = f.node.start(script)
            live.append(proc)
            try:
                proc.close_stdin()
                with tarfile.open(fileobj=_Counted(proc, bar, counter), mode="r|") as tar:  # type: ignore[call-overload]
                    _extract(tar, into, functools.partial(_outside_link, f, src))
                while proc.read():  # the archive's end padding
                    pass
                code = proc.wait()
            except BaseException:
                proc.kill()
                bar.add(-counter[0])
                raise
            _tar_status(f.node, code, proc.stderr, f"sending {src}")
            payloads[f.node.rank] = payload
            sizes[f.node.rank] = _tree_size(payload)

        _each(found, fetch, lambda f: f.node, live)
        for f in found:  # everything arrived: can every copy go where it is going?
            clash = _clash(payloads[f.node.rank], targets[f.node.rank])
            if clash is not None:
                raise SkywardError(_clash_message(clash, "this machine", f"{src} from {f.node.label}"))
        for f in found:  # only now does anything appear at the destinations
            _place(payloads[f.node.rank], targets[f.node.rank])
    return [{"node": f.node.rank, "hostname": f.node.hostname, "source": f"{f.node.pool}:{f.path}",
             "target": str(targets[f.node.rank]), "bytes": sizes[f.node.rank]} for f in found]


def _outside_link(f: _Found, src: str, member: tarfile.TarInfo, why: str) -> SkywardError:
    name = os.path.normpath(member.name)
    on_node = os.path.normpath(os.path.join(f.path, name))
    return SkywardError(
        f"{f.node.label}: {src} holds the link {name} -> {member.linkname}, which points outside the "
        f"copied folder ({why}). A download copies links only when they stay inside what it copies: "
        f"this one would let a later copy into the same folder write where it points. Nothing was "
        f"copied. Remove or replace the link on the node (`skyward ssh {f.node.pool} --node "
        f"{f.node.rank}`, then `rm {q(on_node)}`), or copy what it points to by naming it."
    )


def _check_local_target(target: Path, kind: str) -> None:
    if kind == "file" and target.is_dir():
        raise SkywardError(f"{target}: is a folder here and the node's copy is a file; give a path inside "
                           f"it. Nothing was copied.")
    if kind == "dir" and target.exists() and not target.is_dir():
        raise SkywardError(f"{target}: is a file here and the node's copy is a folder; give another "
                           f"destination. Nothing was copied.")
    for parent in target.parents:
        if parent.exists():
            if not parent.is_dir():
                raise SkywardError(f"{parent}: is a file here, so no folder can be made there. Nothing was copied.")
            if not os.access(parent, os.W_OK):
                raise SkywardError(f"{parent}: cannot be written here (permission denied). Nothing was copied.")
            return


@contextlib.contextmanager
def _staging(targets: list[Path]) -> Iterator[dict[Path, Path]]:
    """A hidden folder beside each destination (the nearest folder that exists, so moving into
    place is a rename on the same filesystem); removed at the end, whatever happened."""
    made: dict[Path, Path] = {}
    stages: dict[Path, Path] = {}
    try:
        for target in targets:
            anchor = next(p for p in target.parents if p.is_dir())
            if anchor not in made:
                made[anchor] = Path(tempfile.mkdtemp(prefix=_STAGE, dir=anchor))
            stages[target] = made[anchor]
        yield stages
    finally:
        for stage in made.values():
            shutil.rmtree(stage, ignore_errors=True)


def _extract(tar: tarfile.TarFile, into: Path, refuse: Callable[[tarfile.TarInfo, str], SkywardError]) -> None:
    """Unpack a node's archive safely: nothing outside ``into``, no devices, owned by you, and no
    link that points outside ``into`` (``refuse(member, why)`` is the error for one)."""

    def check_link(member: tarfile.TarInfo) -> None:
        why = _escapes(member, into)
        if why is not None:
            raise refuse(member, why)

    data_filter = getattr(tarfile, "data_filter", None)
    if data_filter is None:  # Python 3.11.0-3.11.3: the names are checked here
        for member in tar:
            name = Path(member.name)
            if name.is_absolute() or ".." in name.parts or not (member.isfile() or member.isdir() or member.issym()):
                raise SkywardError(f"the node's archive holds {member.name!r}, which is not copied")
            check_link(member)
            tar.extract(member, into, set_attrs=member.isfile())
        _links_inside(into, refuse)
        return

    def keep(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
        check_link(member)
        try:
            return data_filter(member, path)
        except tarfile.FilterError as exc:  # a device, a path through a link: never unpacked
            raise SkywardError(f"the node's archive holds {member.name!r}, which is not copied ({exc})") from None

    tar.extractall(into, filter=keep)
    _links_inside(into, refuse)


def _links_inside(into: Path, refuse: Callable[[tarfile.TarInfo, str], SkywardError]) -> None:
    """Every link of the unpacked copy, judged again now that all of them exist."""
    root = os.path.realpath(into)
    for folder, dirs, files in os.walk(into):
        for name in (*dirs, *files):
            path = Path(folder) / name
            if path.is_symlink() and os.path.commonpath([root, os.path.realpath(path)]) != root:
                link = tarfile.TarInfo(str(path.relative_to(into)))
                link.type, link.linkname = tarfile.SYMTYPE, os.readlink(path)
                raise refuse(link, "it leads above the copied folder, through another link")


def _escapes(member: tarfile.TarInfo, into: Path) -> str | None:
    """Why link ``member`` points outside ``into`` (the copy's root), or None when it does not.

    Resolved on what is unpacked so far, links included, so a link through another link is
    judged by where it really lands, not by its spelling. A link through one the archive lists
    later is judged again once everything is unpacked (``_links_inside``)."""
    if not (member.issym() or member.islnk()):
        return None
    if member.issym() and os.path.isabs(member.linkname):
        return "an absolute path"
    base = into if member.islnk() else into / os.path.dirname(member.name)  # a hard link names an archive path
    root = os.path.realpath(into)
    lands = os.path.realpath(base / member.linkname)
    if os.path.commonpath([root, lands]) != root:
        return "it leads above the copied folder"
    return None


def _is_folder(path: Path) -> bool:
    """A real folder of the copy (a link to one is copied as the link)."""
    return path.is_dir() and not path.is_symlink()


def _clash(payload: Path, target: Path) -> Path | None:
    """The first path where the copy has a folder and the destination has something else, or
    the other way round (a folder the destination has, or links to, is merged into)."""
    if not (target.exists() or target.is_symlink()):
        return None
    if _is_folder(payload) != target.is_dir():
        return target
    if _is_folder(payload):
        for child in sorted(payload.iterdir()):
            found = _clash(child, target / child.name)
            if found is not None:
                return found
    return None


def _place(payload: Path, target: Path) -> None:
    """Move a received copy to its destination: a rename, or, onto a folder that exists, each
    entry moved into it (like ``cp -r`` onto a folder). ``_clash`` was checked first."""
    if _is_folder(payload) and target.is_dir():
        for child in sorted(payload.iterdir()):
            _place(child, target / child.name)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    _rename(payload, target)


def _rename(src: Path, dst: Path) -> None:
    try:
        os.replace(src, dst)
    except OSError:  # another filesystem (a mount inside the destination): copy, then remove
        shutil.move(str(src), str(dst))


def _tree_size(path: Path) -> int:
    if not path.is_dir():
        return path.lstat().st_size
    return sum((Path(r) / f).lstat().st_size for r, _, files in os.walk(path) for f in files)


def _tar_status(node: Node, code: int, stderr: str, doing: str) -> None:
    if code == 0:
        return
    if code == 1 and "changed as we read it" in stderr:  # GNU tar: a file grew while it was read
        from .cliout import err

        err(f"warning: {node.label}: {stderr.strip()}")
        return
    raise SkywardError(f"{node.label}: {doing} failed (tar exit {code}): {stderr.strip()[-500:] or 'no message'}. "
                       f"Nothing was copied.")


def _each(items: list[Any], work: Callable[[Any], None], node_of: Callable[[Any], Node],
          live: list[Process]) -> None:
    """``work`` on every item at once; the first failure (naming its node) once all have ended.
    Interrupted (Ctrl-C), the transfers in ``live`` are ended first, then it is raised."""
    ex = ThreadPoolExecutor(max_workers=min(32, len(items)))
    futures = [(item, ex.submit(work, item)) for item in items]
    try:
        wait([f for _, f in futures])
    except BaseException:
        for proc in list(live):
            with contextlib.suppress(Exception):
                proc.interrupt()
        ex.shutdown(wait=True)
        raise
    ex.shutdown(wait=True)
    for item, future in futures:
        exc = future.exception()
        if exc is None:
            continue
        if isinstance(exc, SkywardError):
            raise exc
        raise SkywardError(f"{node_of(item).label}: the copy failed: {type(exc).__name__}: {exc}. "
                           f"Nothing was copied.") from exc


# -- upload -------------------------------------------------------------------------------------------------
@dataclass
class _Target:
    node: Node
    path: str  # absolute, on the node
    stage: str = ""


def upload(src: Path, dest: str, nodes: list[Node], *, show: bool) -> list[dict[str, Any]]:
    local = src.expanduser()
    origin = local.resolve() if local.is_symlink() else local  # a link given by name: what it points to
    kind = "dir" if origin.is_dir() else "file"
    base = Path(os.path.abspath(local)).name
    if not base:
        raise ConfigError(f"{src} is the root folder of this machine: name a folder inside it.")
    size = _tree_size(origin) if kind == "dir" else origin.stat().st_size
    slash = "1" if dest.endswith("/") else "0"
    check = (
        f"dest={node_path(dest)}\n"
        f'if [ -d "$dest" ] || [ {slash} = 1 ]; then target="${{dest%/}}"/{q(base)}; else target="$dest"; fi\n'
        'case $target in /*) ;; *) target="$PWD/${target#./}";; esac\n'
        f'if [ -d "$target" ] && [ {kind} = file ]; then echo "@@isdir $target"; exit 0; fi\n'
        f'if [ -e "$target" ] && [ ! -d "$target" ] && [ {kind} = dir ]; then echo "@@isfile $target"; exit 0; fi\n'
        'anc=$(dirname -- "$target")\n'
        'while [ ! -d "$anc" ]; do\n'
        '  if [ -e "$anc" ]; then echo "@@notdir $anc"; exit 0; fi\n'
        '  anc=$(dirname -- "$anc")\n'
        'done\n'
        '[ -w "$anc" ] || { echo "@@unwritable $anc"; exit 0; }\n'
        'echo "@@target $target"\n'
    )

    def where(node: Node) -> _Target | str:
        facts = _look(node, check, dest, str(src), needed="target")
        if isinstance(facts, str):
            return facts
        return _Target(node, facts["target"])

    targets: list[_Target] = _check_all(nodes, where)
    live: list[Process] = []
    with _Progress(f"{base} to {len(targets)} node(s)", size * len(targets), show) as bar:
        def send(t: _Target) -> None:
            script = (
                f"target={q(t.path)}\n"
                'anc=$(dirname -- "$target"); while [ ! -d "$anc" ]; do anc=$(dirname -- "$anc"); done\n'
                f'stage=$(mktemp -d "$anc/{_STAGE}XXXXXX") || exit 1\n'
                "trap 'rm -rf -- \"$stage\"' EXIT; trap 'exit 1' HUP INT TERM\n"
                'tar -x --no-same-owner -f - -C "$stage" || exit 1\n'
                f"payload=\"$stage\"/{q(base)}\n"
                + _CLASH +
                "trap - EXIT\n"
                'echo "@@stage $stage"\n'
            )
            counter = [0]
            proc = t.node.start(script)
            live.append(proc)
            try:
                with tarfile.open(fileobj=_Sink(proc, bar, counter), mode="w|", bufsize=1 << 20) as tar:  # type: ignore[call-overload]
                    tar.add(str(origin), arcname=base)
                code, out = finish(proc)
            except BaseException:
                proc.kill()
                bar.add(-counter[0])
                raise
            facts = _facts(out.decode(errors="replace"))
            if "clash" in facts:
                raise SkywardError(_clash_message(Path(facts["clash"]), t.node.label, str(src)))
            t.stage = facts.get("stage", "")
            if code != 0 or not t.stage:
                t.stage = ""
                _tar_status(t.node, code or 1, proc.stderr, f"receiving {src}")

        try:
            _each(targets, send, lambda t: t.node, live)
        except BaseException:
            _abort(targets)
            raise
    failed = []
    for t in targets:  # every node has all of it: now move it into place
        payload = f"{t.stage}/{base}"
        code, _, error = t.node.run(
            f"target={q(t.path)}; payload={q(payload)}\n"
            'mkdir -p -- "$(dirname -- "$target")" || exit 1\n'
            'if [ -d "$payload" ]; then\n'
            '  if ! mv -T -- "$payload" "$target" 2>/dev/null; then\n'
            '    mkdir -p -- "$target" && cd -- "$payload" || exit 1\n'
            "    find . -mindepth 1 -type d -exec sh -c 'for d; do mkdir -p \"$0/$d\" || exit 1; done' \"$target\" {} + &&\n"
            "    find . ! -type d -exec sh -c 'for f; do mv -f \"$f\" \"$0/$f\" || exit 1; done' \"$target\" {} + || exit 1\n"
            "  fi\n"
            'else\n'
            '  mv -f -- "$payload" "$target" || exit 1\n'
            'fi\n'
            f"rm -rf -- {q(t.stage)}\n")
        if code != 0:
            failed.append(f"{t.node.label}: {error.strip()[-300:] or f'exit {code}'}")
    if failed:
        _abort(targets)
        raise SkywardError(f"moving {src} into place failed on " + "; ".join(failed))
    return [{"node": t.node.rank, "hostname": t.node.hostname, "source": str(src),
             "target": f"{t.node.pool}:{t.path}", "bytes": size} for t in targets]


# After unpacking an upload (in bash, $payload and $target set): the first path where the copy
# has a folder and the node has something else, or the other way round; the stage is removed.
_CLASH = """\
if [ -d "$payload" ] && [ ! -L "$payload" ] && [ -d "$target" ]; then
  clash=$(cd -- "$payload" && find . -mindepth 1 -exec sh -c '
    for p; do
      t="$0/${p#./}"
      if [ -d "$p" ] && [ ! -L "$p" ]; then
        if { [ -e "$t" ] || [ -L "$t" ]; } && [ ! -d "$t" ]; then echo "$t"; fi
      elif [ -d "$t" ]; then echo "$t"; fi
    done' "$target" {} + | head -n 1)
  if [ -n "$clash" ]; then echo "@@clash $clash"; exit 0; fi
fi
"""


def _clash_message(where: Path, label: str, what: str) -> str:
    return (f"{where}: the copy of {what} has a folder where {label} has a file, or a file where it has a "
            f"folder; move it away or copy to another destination. Nothing was copied.")


def _abort(targets: list[_Target]) -> None:
    """Remove what was staged on the nodes (best effort: each node on its own)."""
    for t in targets:
        if t.stage:
            with contextlib.suppress(Exception):
                t.node.run(f"rm -rf -- {q(t.stage)}")
