"""The ``skyward`` command: named pools from the shell.

    skyward up NAME [--provider local --nodes 2 --ttl 600]   start a pool that outlives the command
    skyward ls | status NAME | history NAME                  what runs, how it is, who did what
    skyward history [POOL_ID] [--verify] | diff A B          every pool's record, the trail's integrity
    skyward reproduce POOL_ID [--name NAME] [--strict]       a pool again, everything pinned
    skyward exec NAME -- CMD | logs NAME [-f]                a shell command on every node; agent logs
    skyward install NAME PKG... | events NAME                packages on every node; a post-mortem
    skyward ssh NAME [-- CMD] | cp SRC DEST                  a shell on a node; files to and from nodes
    skyward notebook NAME | ssh-config [NAME]                JupyterLab/marimo on a node; ssh NAME-0 by name
    skyward serve NAME [APP] [--update]                      an ASGI app served from the pool's nodes
    skyward down NAME | --all | --expired                    stop pools
    skyward preview NAME | offers                            what a pool would be, what can be had

Exit codes: 0 ok, 1 the command failed, 2 bad usage or configuration. ``--json`` prints
machine-readable output on stdout; messages and progress go to stderr.

argparse (standard library) is enough here: nine subcommands with a few flags each, and no
extra dependency for a package that is installed on every node.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from ..errors import ConfigError, PoolNotFoundError, ProviderError, SkywardError
from ..version import __version__
from .cliout import EXIT_FAILED, EXIT_OK, EXIT_USAGE, err, format_table, money, print_json, say
from .groupviews import node_count

if TYPE_CHECKING:
    from ..core.pool import Pool
    from .pools import PoolStatus


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"skyward: error: {message}\n")


# The commands whose code lives in a module of its own, in the order `skyward --help` lists them,
# with their one-line help (the parser's help and description: the module's adder calls
# ``command(NAME)`` and gets it from here). A module is imported only to run its command
# (_add_module_command): importing them all cost more than the rest of a start.
_MODULE_COMMANDS = {
    "dashboard": "Serve a web dashboard and HTTP API of this machine's pools "
                 "(needs the dashboard extra: pip install 'skyward[dashboard]').",
    "run": "Run a Python script with a named pool active (`f(x) >> sky` needs no "
           "`with`); a pool that does not run is started from skyward.toml for the run.",
    "events": "A named pool's event history for a post-mortem: its events (nodes, bootstrap "
              "phases, losses, errors) and its audit trail, oldest first; also after `down`.",
    "install": "Add Python packages to a running named pool: resolved once here, the same "
               "versions installed on every node, kept in the pool's lock and record.",
    "ssh": "A shell on a node of a running pool, in the node's working directory with "
           "the pool's environment (what its tasks see); with -- CMD, that one command, "
           "exiting with its exit status.",
    "cp": "Copy files or folders to or from the nodes of a running pool: LOCAL NAME:PATH "
          "uploads to every node (or --node N); NAME:PATH LOCAL downloads, from every "
          "node into LOCAL/node-<N>/ or from --node N into LOCAL. Relative node paths "
          "start in the node's working directory.",
    "notebook": "JupyterLab (or marimo) on a node of a running pool, in the pool's environment, "
                "served on a local port through the pool's connection; Ctrl-C stops it.",
    "ssh-config": "Write the SSH config entries (NAME-0, NAME-1, ...) of a running pool's nodes, "
                  "so that ssh, scp, rsync and VS Code reach them by name; print the Include line "
                  "for ~/.ssh/config.",
    "proxy": "Carry ssh's stdin and stdout to a node's sshd the way the pool reaches it: the "
             "ProxyCommand of the entries `skyward ssh-config` writes (not for use by hand).",
    "serve": "Serve an ASGI app ('module:attr') from a named pool's nodes behind an endpoint "
             "on this machine, until Ctrl-C; with --update, roll the running `skyward serve "
             "NAME` to another app.",
}


def _add_module_command(name: str, command: Callable[[str], argparse.ArgumentParser]) -> None:
    """Import the module of one of _MODULE_COMMANDS and let it add its parser (its arguments and
    ``handler=``)."""
    if name == "dashboard":
        from ..dashboard.command import add_dashboard as add
    elif name == "run":
        from .runscript import add_run as add
    elif name == "events":
        from .eventlog import add_events as add
    elif name == "install":
        from .install import add_install as add
    elif name == "ssh":
        from .shell import add_ssh as add
    elif name == "cp":
        from .copy import add_cp as add
    elif name == "notebook":
        from .notebook import add_notebook as add
    elif name == "ssh-config":
        from .sshconfigcli import add_ssh_config as add
    elif name == "proxy":
        from .proxy import add_proxy as add
    elif name == "serve":
        from .servecli import add_serve as add
    else:
        raise KeyError(name)
    add(command)


def _command_word(words: Sequence[str]) -> str | None:
    """The command a command line runs: its first word that is not a flag (the top level's
    flags, --help and --version, take no value); None when there is none."""
    return next((word for word in words if not word.startswith("-")), None)


def _parser(running: str | None = None, *, every: bool = True) -> argparse.ArgumentParser:
    """The whole parser. With ``every=False``, only the module command ``running`` (if it is
    one) is added in full; the others are added by name and help alone, which is all that
    ``skyward --help`` and the error for an unknown command show of them."""
    parser = _Parser(
        prog="skyward",
        description="Run Python functions on pools of machines. These commands manage named "
        "pools, which a program reaches with sky.Compute(name=...).",
        epilog="Exit codes: 0 ok, 1 failure, 2 usage or configuration error.",
    )
    parser.add_argument("--version", action="version", version=f"skyward {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def command(name: str, help: str | None = None) -> argparse.ArgumentParser:
        help = _MODULE_COMMANDS[name] if help is None else help
        p = sub.add_parser(name, help=help, description=help)
        p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
        return p

    def pool_flags(p: argparse.ArgumentParser, *, optional_name: bool = False) -> None:
        if optional_name:
            p.add_argument("name", nargs="?", help="the pool's name ([pools.NAME] in skyward.toml); "
                                                   "leave it out to preview what the flags describe")
        else:
            p.add_argument("name", help="the pool's name ([pools.NAME] in skyward.toml)")
        p.add_argument("--config", type=Path, help="skyward.toml to read (default: nearest one)")
        p.add_argument("--provider", help="local, ssh, slurm, container, aws or gcp")
        p.add_argument("--nodes", metavar="N|DESIRED:MAX",
                       help="N nodes, or DESIRED:MAX: an elastic pool that starts with DESIRED and grows "
                            "up to MAX while tasks wait; 0:MAX sleeps with no node when idle")
        p.add_argument("--accelerator", help="e.g. A100, H100:8")
        p.add_argument("--ttl", type=int, help="seconds with no client before the nodes stop; 0 = never")
        p.add_argument("--region", help="cloud region")
        p.add_argument("--allocation", help="spot-if-available, spot, on-demand or cheapest")
        p.add_argument("--max-hourly-cost", type=float, help="USD per node-hour cap")

    p = command("up", "Start a named pool that keeps running after this command.")
    pool_flags(p)
    p.add_argument("--console", choices=["rich", "log", "minimal", "silent"],
                   help="how to show progress (default: rich on a terminal, log otherwise)")

    p = command("down", "Stop named pools and remove their records.")
    p.add_argument("name", nargs="?", help="the pool to stop")
    p.add_argument("--all", action="store_true", help="stop every registered pool")
    p.add_argument("--expired", action="store_true", help="clean up pools whose ttl ran out")
    p.add_argument("--force", action="store_true",
                   help="stop pools that programs are using without asking")

    command("ls", "List the named pools: provider, nodes, state, age, expiry, cost.")

    p = command("status", "One pool's nodes: reachable or not, hostname, agent, clients. A pool of "
                          "more than 64 nodes is shown from its last probe (with its age) unless --probe.")
    p.add_argument("name")
    p.add_argument("--group", help="only this group's nodes (a pool of several groups)")
    fresh = p.add_mutually_exclusive_group()
    fresh.add_argument("--probe", action="store_true",
                       help="contact every node now (32 at a time), whatever the pool's size")
    fresh.add_argument("--cached", action="store_true",
                       help="contact no node: show the last probe's results and when they were taken")

    p = command("history", "Recent pools and their ids; a pool's record (POOL_ID) or a name's audit "
                           "trail (NAME); --verify checks the trail's hash chain.")
    p.add_argument("name", nargs="?", metavar="POOL_ID|NAME")
    p.add_argument("--verify", action="store_true", help="check that no audit line was changed, removed or reordered")
    p.add_argument("--limit", type=int, default=20, help="list at most this many pools (default 20)")

    p = command("reproduce", "Start a named pool again from a pool's record, everything pinned.")
    p.add_argument("pool_id", metavar="POOL_ID")
    p.add_argument("--name", help="the new pool's name (default: the recorded name, else repro-POOL_ID)")
    p.add_argument("--strict", action="store_true", help="refuse when anything cannot be the same")
    p.add_argument("--console", choices=["rich", "log", "minimal", "silent"], help="how to show progress")

    p = command("diff", "What differs between two pools' records; exit 1 when anything does.")
    p.add_argument("a", metavar="POOL_A")
    p.add_argument("b", metavar="POOL_B")

    p = command("preview", "What `up NAME` (or a pool of the flags alone) would create and what "
                           "it costs per hour; creates nothing.")
    pool_flags(p, optional_name=True)

    p = command("offers", "What the cloud catalogues sell that fits, cheapest first; with --provider slurm, a Slurm cluster's partitions.")
    p.add_argument("--provider", help="aws or gcp (default: both), or slurm: the partitions of a Slurm cluster (sinfo)")
    p.add_argument("--accelerator", help="e.g. A100, H100:8 (default: CPU-only types)")
    p.add_argument("--vcpus", type=float, help="at least this many vCPUs")
    p.add_argument("--memory-gb", type=float, help="at least this much memory (GB)")
    p.add_argument("--region", help="only this region")
    p.add_argument("--allocation", default="cheapest",
                   help="price under: cheapest (default), spot, on-demand, spot-if-available")
    p.add_argument("--max-hourly-cost", type=float, help="USD per node-hour at most")
    p.add_argument("--limit", type=int, default=20, help="show at most this many (default 20)")
    p.add_argument("--login", help="slurm: the login node to ask (user@host[:port]); default: the one "
                                   "the [pools.NAME.slurm] table of skyward.toml names")
    p.add_argument("--key", help="slurm: the SSH key for --login")
    p.add_argument("--pool", help="slurm: the pool of skyward.toml whose login node to ask (when it defines several)")

    p = command("exec", "Run a shell command on every node of a pool: one result per node.")
    p.add_argument("name")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per node (default 60)")
    p.add_argument("--no-wake", action="store_true", help="refuse with an error when the pool is asleep, instead of waking it for this command")
    p.add_argument("--group", help="only this group's nodes (a pool of several groups)")
    p.add_argument("cmd", nargs="*", metavar="-- CMD", help="the command, after --")

    p = command("logs", "The agent logs of a pool's nodes.")
    p.add_argument("name")
    p.add_argument("--node", type=int, help="only this node (with --group: its rank within the group)")
    p.add_argument("--group", help="only this group's nodes (a pool of several groups)")
    p.add_argument("--lines", type=int, default=100, help="last N lines (default 100)")
    p.add_argument("-f", "--follow", action="store_true",
                   help="then print new lines as they come, prefixed by node, until Ctrl-C")

    p = command("resize", "change the number of nodes of a running pool, or of one of its groups")
    p.add_argument("name")
    p.add_argument("nodes", metavar="N|DESIRED:MAX",
                   help="the new size: N nodes (0 puts it to sleep until a task needs it) or DESIRED:MAX")
    p.add_argument("--group", help="the group to resize (required when the pool has several)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the new size (default 120)")

    for name in _MODULE_COMMANDS:  # in their own modules; each adds handler= to its parser
        if every or name == running:
            _add_module_command(name, command)
        else:
            command(name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    command: list[str] = []
    if "--" in words:  # everything after -- is the command of `exec`, flags included
        at = words.index("--")
        words, command = words[:at], words[at + 1:]
    parser = _parser(_command_word(words), every=False)
    args = parser.parse_args(words)
    if command:
        if args.command not in ("exec", "run", "ssh"):
            parser.error("only `skyward exec NAME -- CMD`, `skyward ssh NAME -- CMD` and "
                         "`skyward run NAME SCRIPT -- ARGS` take words after --")
        args.cmd = [*args.cmd, *command]
    if args.command is None:  # a command is required: the help says which
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    warnings.showwarning = _show_warning
    _learn_secrets(args)
    handler = getattr(args, "handler", None) or globals()[f"cmd_{args.command}"]
    try:
        code: int = handler(args)
        return code
    except ConfigError as exc:
        err(f"error: {exc}")
        return EXIT_USAGE
    except SkywardError as exc:
        err(f"error: {exc}")
        return EXIT_FAILED
    except KeyboardInterrupt:
        err("interrupted")
        return 130
    except BrokenPipeError:  # `skyward ls | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED


def _learn_secrets(args: argparse.Namespace) -> None:
    """Register the secret env values of the running named pool this command names (NAME, or
    the NAME of cp's NAME:PATH) before anything is printed: what its nodes print, the command
    itself in a progress line or an error, then go out masked (cliout)."""
    from ..observe.secrets import register_env
    from .registry import NAME_RULE
    from .registry import read as read_record

    names = [getattr(args, "name", None)]
    names += [value.split(":", 1)[0] for value in (getattr(args, "source", None), getattr(args, "dest", None))
              if isinstance(value, str) and ":" in value]
    for name in names:
        if isinstance(name, str) and NAME_RULE.match(name):
            image = (((read_record(name) or {}).get("config") or {}).get("image") or {})
            env = image.get("env") if isinstance(image, dict) else None
            if isinstance(env, dict):
                register_env({k: v for k, v in env.items() if isinstance(v, str)})


# -- output (exit codes, err, tables and JSON: cliout.py) ------------------------------------
def _show_warning(message: Any, category: Any, filename: str, lineno: int, file: Any = None,
                  line: str | None = None) -> None:
    err(f"warning: {message}")


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d"


@contextlib.contextmanager
def _progress(message: str) -> Iterator[None]:
    """A spinner on a terminal, one line otherwise."""
    if sys.stderr.isatty():
        from rich.console import Console

        from ..observe.secrets import redact

        with Console(stderr=True).status(redact(message)):
            yield
    else:
        err(message)
        yield


def _summary(record: dict[str, Any], st: PoolStatus | None = None) -> dict[str, Any]:
    """What listings show of a record: never the token or how to log in."""
    from . import sleep
    from .groupviews import group_views
    from .pools import _total_cost

    cluster = record.get("cluster") or {}
    nodes = [{k: n.get(k) for k in ("index", "hostname", "private_ip", "public_ip")}
             | ({"group": g} if record.get("groups") else {})
             for g, view in group_views(record).items() for n in (view.get("cluster") or {}).get("nodes", [])]
    now = time.time()
    out = {
        "name": record["name"],
        "id": record.get("id"),
        "provider": record.get("provider"),
        "nodes": len(nodes),
        "max_nodes": sleep.ceiling(record),
        "may_sleep": sleep.may_sleep(record),  # nodes = [0, N]: asleep (0 nodes) when idle
        "asleep_since": record.get("asleep_since") if sleep.is_asleep(record) else None,
        "hosts": nodes,
        "ttl": record.get("ttl"),
        "created": record.get("created"),
        "age_seconds": round(now - float(record.get("created", now)), 1),
        "hourly_cost": _total_cost(record),
        "offer": record.get("offer"),
        "owner": (record.get("owner") or {}).get("who"),
        "clients": len(record.get("clients", [])),
        "ephemeral": record.get("ephemeral", False),
        "groups": _groups_summary(record),
        "head": record.get("head"),
    }
    if out["groups"]:
        out["provider"] = "+".join(dict.fromkeys(str(g["provider"]) for g in out["groups"]))
    if st is not None:
        out["state"] = st.state
        out["nodes_down"] = list(st.nodes_down)
        out["expires"] = st.expires
        out["expires_in_seconds"] = None if st.expires is None else round(st.expires - now, 1)
        if record.get("provider") == "slurm" and cluster and not st.gone:
            out["slurm"] = _slurm_jobs(record)
    return out


def _groups_summary(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Each group of a pool of several groups: its name, provider and nodes ([] for one spec)."""
    from .groupviews import group_views
    from .pools import _total_cost

    if not record.get("groups"):
        return []
    return [{"name": g, "provider": v.get("provider"), "nodes": node_count(v),
             "head": g == record.get("head"), "offer": v.get("offer"),
             "hourly_cost": _total_cost({**v, "groups": None})} for g, v in group_views(record).items()]


def _slurm_jobs(record: dict[str, Any]) -> dict[str, Any]:
    """A Slurm pool's jobs as the queue shows them now (providers/slurm.py: Slurm.jobs)."""
    from .pools import provider_from

    try:
        return {"jobs": provider_from(record["config"]).jobs(record["cluster"])}  # type: ignore[attr-defined]
    except SkywardError as exc:
        return {"jobs": None, "error": str(exc)}


def _slurm_cell(row: dict[str, Any]) -> str:
    """``job 12 RUNNING``, ``job 12 PENDING (Resources)``: the jobs of a Slurm pool's row."""
    jobs = (row.get("slurm") or {}).get("jobs")
    if jobs is None:
        return "" if "slurm" not in row else "jobs: ? (login node unreachable)"
    return ", ".join(f"job {j['job']} {j['state']}" + (f" ({j['reason']})" if j["reason"] not in ("", "None") else "")
                     for j in jobs)


def _opportunistic_cleanup() -> None:
    from .pools import cleanup_expired

    for st in cleanup_expired():
        err(f"removed expired pool {st.name!r} ({st.state})")


# -- configuration from flags ------------------------------------------------------------------
def _flags(args: argparse.Namespace) -> dict[str, Any]:
    flags: dict[str, Any] = {}
    for key in ("provider", "nodes", "accelerator", "ttl", "region", "allocation", "max_hourly_cost"):
        value = getattr(args, key, None)
        if value is not None:
            flags[key] = value
    if "nodes" in flags:
        from .config import parse_nodes

        flags["nodes"] = parse_nodes(flags["nodes"])
    return flags


def _load(args: argparse.Namespace) -> Any:
    from .config import load

    if args.config is not None and not args.config.is_file():
        raise ConfigError(f"--config {args.config}: no such file. Give the path of a skyward.toml.")
    return load(args.name, project=args.config, flags=_flags(args))


# -- commands ----------------------------------------------------------------------------------
def cmd_up(args: argparse.Namespace) -> int:
    from ..spec import Options
    from .pools import provision

    cfg = _load(args)
    _opportunistic_cleanup()
    console: Any = args.console or ("silent" if args.json else True)
    pool = provision(cfg, Options(console=console), keep=True)
    from .registry import read

    record = read(cfg.name) or {}
    nodes = pool.current_nodes()
    pool.detach()  # the nodes stay; their lease (ttl) decides from now on
    ttl = int(record.get("ttl", 0))
    if args.json:
        print_json(_summary(record))
        return EXIT_OK
    stops = (f"stops after {ttl} s with no client attached" if ttl
             else "never stops by itself (ttl 0): run `skyward down` when done")
    summary = _summary(record)
    if summary["may_sleep"] and nodes == 0:
        ends = (f"it is removed after {ttl} s with no client attached" if ttl
                else "it stays until `skyward down` (ttl 0)")
        print(f"pool {cfg.name!r} is up and asleep: 0/{summary['max_nodes']} {record.get('provider')} node(s), "
              f"costing nothing until a program's first task wakes it; it sleeps again when idle; {ends}.")
    else:
        print(f"pool {cfg.name!r} is up: {nodes} {record.get('provider')} node(s), "
              f"{money(summary['hourly_cost'])}/h; it {stops}.")
    print(f"attach with sky.Compute(name={cfg.name!r}); stop with `skyward down {cfg.name}`.")
    from . import sshconfig

    if sshconfig.has_entries(cfg.name):  # written by provision(): say how ssh finds them
        print(sshconfig.how_to_use(cfg.name))
    return EXIT_OK


def cmd_down(args: argparse.Namespace) -> int:
    from . import pools as named
    from . import registry

    if bool(args.name) + args.all + args.expired != 1:
        raise ConfigError("down takes one of: a pool NAME, --all, or --expired.")
    if args.expired:
        with _progress("removing expired pools"):
            removed = named.cleanup_expired()
        gone, failed_orphans = _destroy_orphans()
        disks = _sweep_disks()  # after the stacks: a destroyed stack takes its own disks
        if args.json:
            print_json([{"name": st.name, "state": st.state} for st in removed]
                  + [{"name": stack, "state": "orphaned"} for stack in gone]
                  + [{"name": d.name, "state": "orphaned disk", **d.describe()} for d in disks.deleted])
        else:
            print("\n".join([f"removed {st.name} ({st.state})" for st in removed]
                            + [f"removed {stack} (cloud pool whose program is gone)" for stack in gone]
                            + [f"deleted disk {d.name} (GCP project {d.project}, zone {d.zone}): an orphaned "
                               f"sky.Disk of pool {d.pool}, whose nodes are gone" for d in disks.deleted])
                  or "no expired pools")
        if disks.manual:
            (err if args.json else print)(disks.manual)
        for failure in disks.failed:
            err(f"error: orphaned GCP disks: {failure}")
        return EXIT_FAILED if failed_orphans or disks.failed else EXIT_OK
    names = registry.names() if args.all else [args.name]
    done, failed = [], []
    for name in names:
        try:
            # An unknown name is only that (nothing is being stopped); one in use is asked about.
            if not _may_stop(named.get(name), args.force):
                failed.append(name)
                continue
            with _progress(f"stopping pool {name!r}"):
                record = named.down(name)
            done.append(_summary(record))
            if not args.json:
                print(f"pool {name!r} destroyed")
        except PoolNotFoundError:
            if not args.all:
                raise
        except SkywardError as exc:
            failed.append(name)
            err(f"error: {exc}")
    if args.json:
        print_json(done)
    elif args.all and not done and not failed:
        print("no pools")
    return EXIT_FAILED if failed else EXIT_OK


def _orphans() -> list[Any]:
    """Unnamed cloud pools of this machine whose program died without teardown (their stacks
    may still hold instances and disks); empty when the cloud extras are not installed."""
    try:
        from ..stacks import orphans
    except ImportError:
        return []
    return orphans.orphans()


def _destroy_orphans() -> tuple[list[str], list[str]]:
    from ..stacks import orphans

    gone, failed = [], []
    for orphan in _orphans():
        try:
            with _progress(f"destroying the stack {orphan.stack} (its program is gone)"):
                orphans.destroy(orphan)
            gone.append(orphan.stack)
        except SkywardError as exc:
            failed.append(orphan.stack)
            err(f"error: the stack {orphan.stack} of a {orphan.kind} pool whose program is gone could not "
                 f"be destroyed: {exc}")
    return gone, failed


def _sweep_disks() -> Any:
    """GCP sky.Disk disks whose node Compute Engine deleted before it marked them auto-delete,
    deleted once their pool is gone (stacks/gcp_disks.py)."""
    from ..stacks import gcp_disks

    with _progress("looking for orphaned GCP disks"):
        return gcp_disks.sweep()


def _orphan_rows() -> list[dict[str, Any]]:
    from ..stacks import orphans

    rows = []
    for orphan in _orphans():
        try:
            left: Any = orphans.remaining(orphan)
            what = ", ".join(sorted({r["type"].rsplit(":", 1)[-1] for r in left})) or "nothing"
        except SkywardError as exc:
            left, what = None, f"unknown ({str(exc).splitlines()[0]})"
        rows.append({
            "name": orphan.stack, "provider": orphan.kind, "orphan": True, "pool_id": orphan.pool_id,
            "client_pid": orphan.pid, "age_seconds": round(time.time() - orphan.created, 1),
            "nodes": len((orphan.description.get("plan") or {}).get("nodes") or []),
            "resources": left, "state": f"program gone (pid {orphan.pid}); still there: {what}",
        })
    return rows


def _may_stop(record: dict[str, Any], force: bool) -> bool:
    """A pool programs are attached to: say so; stop it with --force, or when the user at the
    terminal says yes. Not on a terminal and not forced: leave it running."""
    from .pools import live_clients

    clients = live_clients(record)
    if not clients:
        return True
    name = record["name"]
    who = ", ".join(f"{c.get('who')} pid {c.get('pid')} since "
                    f"{time.strftime('%H:%M:%S', time.localtime(float(c.get('since') or 0)))}" for c in clients)
    err(f"warning: pool {name!r} is in use: {len(clients)} client(s) attached ({who}); stopping it "
         f"ends their work with PoolStoppedError.")
    if force:
        return True
    if sys.stdin.isatty() and sys.stderr.isatty():
        print(f"skyward: stop pool {name!r} anyway? [y/N] ", end="", file=sys.stderr, flush=True)
        return sys.stdin.readline().strip().lower() in ("y", "yes")
    err(f"error: pool {name!r} was not stopped because it is in use; `skyward down {name} --force` "
         f"stops it anyway.")
    return False


def cmd_ls(args: argparse.Namespace) -> int:
    from ..bootstrap import sweep
    from .pools import statuses

    sweep.local_pools()  # Local pools' folders whose processes were all killed
    listed = statuses()
    rows = [_summary(st.record, st) for st in listed]
    gone = {st.name for st in listed if st.gone}
    if gone:
        _opportunistic_cleanup()
    for row in rows:
        row["removed"] = row["name"] in gone
        row["serving"] = None if row["removed"] else _serving(row["name"])
    orphan_rows = _orphan_rows()
    if args.json:
        print_json(rows + orphan_rows)
        return EXIT_OK
    if not rows and not orphan_rows:
        print("no pools (start one with `skyward up NAME`)")
        return EXIT_OK
    table = []
    for r in rows:
        expiry = ("never" if r["ttl"] == 0 else "-" if r["expires_in_seconds"] is None
                  else "now" if r["expires_in_seconds"] <= 0 else f"in {_duration(r['expires_in_seconds'])}")
        state = r["state"] + (" (removed)" if r["removed"] else "")
        if r["state"] == "in use":
            state += f" ({r['clients']} client(s))"
        if r["nodes_down"]:
            state += f", {len(r['nodes_down'])} of {r['nodes']} nodes down"
        if r["state"] == "asleep" and r["clients"]:
            state += f" ({r['clients']} client(s))"
        if _slurm_cell(r):
            state += f", {_slurm_cell(r)}"
        table.append([r["name"], str(r["provider"]), _nodes_cell(r), state,
                      _duration(r["age_seconds"]), expiry, money(r["hourly_cost"])])
        for g in r["groups"]:  # a pool of several groups: a line for each, under the pool's
            table.append([f"  {g['name']}" + (" (head)" if g["head"] else ""), str(g["provider"]),
                          str(g["nodes"]), "", "", "", money(g["hourly_cost"])])
    for r in orphan_rows:
        table.append([r["name"], r["provider"], str(r["nodes"]), r["state"], _duration(r["age_seconds"]), "-", "-"])
    print(format_table(["NAME", "PROVIDER", "NODES", "STATE", "AGE", "EXPIRES", "$/H"], table))
    served = [r for r in rows if r["serving"]]
    if served:
        print("\n" + format_table(["SERVED", "URL", "APP", "READY", "REQ/S", "PID"], [
            [r["name"], s["url"], str(s["app"]), f"{s['ready']}/{s['replicas']}" + (" (updating)" if s["updating"] else ""),
             f"{s['requests_per_s']:.1f}", str(s["pid"])] for r in rows if (s := r["serving"])]))
    if orphan_rows:
        print("\nCloud pools whose program ended without tearing them down may still cost money: "
              "`skyward down --expired` destroys their stacks.")
    return EXIT_OK


def _serving(name: str) -> dict[str, Any] | None:
    """The endpoint a `skyward serve NAME` process serves now (skyward.named.serving), or None."""
    from .serving import read_status

    status = read_status(name)
    if status is None:
        return None
    keys = ("url", "app", "auth", "ready", "replicas", "requests_per_s", "requests", "in_flight", "queued",
            "updating", "pid", "host", "updated")
    return {k: status.get(k) for k in keys}


def _nodes_cell(row: dict[str, Any]) -> str:
    """``2``, or ``0/4`` for a pool that sleeps at zero: the nodes now / the most it grows to."""
    return f"{row['nodes']}/{row['max_nodes']}" if row.get("may_sleep") else str(row["nodes"])


def cmd_status(args: argparse.Namespace) -> int:
    from . import probe
    from .pools import get, status_of

    record = get(args.name)
    st = status_of(record)
    if st.asleep:
        return _status_asleep(args, record, st)
    views = _selected_groups(record, args.group)
    running = not st.gone and st.state != "provisioning"
    count = sum(map(node_count, views.values()))
    live = running and (args.probe or (not args.cached and count <= probe.LIVE_NODES))
    at: float | None = None
    grouped = bool(record.get("groups"))
    if not running:
        nodes: list[dict[str, Any]] = []
    elif live:
        with _progress(f"contacting {count} node(s), {probe.PARALLEL} at a time"):
            nodes = []
            for g, view in views.items():  # a group's nodes are numbered by their rank in it
                found = probe.probe(view) if (view.get("cluster") or {}).get("nodes") else []
                nodes += [{**n, "group": g, "rank": i} for i, n in enumerate(found)] if grouped else found
        at = time.time()
        if not grouped:
            probe.save(record, nodes, at)
    elif grouped:  # the last probe is kept for pools of one group only
        nodes = [{**n, "group": g, "rank": i} for g, view in views.items() for i, n in enumerate(probe.unknown(view))]
    else:
        nodes, at = probe.last(record)
    age = None if at is None else round(time.time() - at, 1)
    out = {**_summary(record, st), "nodes": nodes,
           "clients": [{k: c.get(k) for k in ("who", "pid", "since")} for c in record.get("clients", [])],
           "probe": {"live": live, "at": at, "age_seconds": age}}
    # Unhealthy: a node known to be down (nodes never probed count as neither).
    healthy = bool(nodes) and not any(n["reachable"] is False for n in nodes)
    if args.json:
        print_json(out)
        return EXIT_OK if healthy else EXIT_FAILED
    count_text = f"{len(nodes)}/{out['max_nodes']}" if out["may_sleep"] else str(len(nodes))
    print(f"pool {record['name']!r}: {st.state}, {out['provider']}, {count_text} node(s), "
          f"ttl {record.get('ttl')} s, {len(out['clients'])} client(s) attached")
    for g in out["groups"]:
        if args.group in (None, g["name"]):
            print(f"group {g['name']!r}{' (head)' if g['head'] else ''}: {g['provider']}, {g['nodes']} node(s)")
    if running and not live:
        when = "never probed" if at is None else f"health as of its last probe, {_duration(age or 0)} ago"
        print(f"{when}; `skyward status {record['name']} --probe` contacts the {count} node(s) now "
              f"({probe.PARALLEL} at a time)")
    for job in (out.get("slurm") or {}).get("jobs") or []:
        why = f" (reason {job['reason']})" if job["reason"] not in ("", "None") else ""
        print(f"Slurm job {job['job']}: {job['state']}{why} on {','.join(job['nodes'])} "
              f"(pool nodes {', '.join(str(i) for i in job['pool_nodes'])}; Slurm's list {job['nodelist'] or '-'})")
    if (out.get("slurm") or {}).get("error"):
        print(f"Slurm jobs: unknown ({out['slurm']['error']})")
    if nodes:
        rows = [[*([n["group"], str(n["rank"])] if grouped else [str(n["index"])]),
                 n.get("hostname") or "-", n.get("private_ip") or "-",
                 {True: "ok", False: "UNREACHABLE", None: "?"}[n["reachable"]], str(n.get("agent_pid") or "-"),
                 str(n.get("python") or "-"), "-" if n.get("tasks") is None else str(n["tasks"]),
                 n.get("error") or ""] for n in nodes]
        print(format_table([*(["GROUP", "NODE"] if grouped else ["NODE"]), "HOST", "IP", "HEALTH", "AGENT PID",
                            "PYTHON", "TASKS", ""], rows))
    if out["may_sleep"]:
        _print_wakes(record["name"])
    return EXIT_OK if healthy else EXIT_FAILED


def _selected_groups(record: dict[str, Any], group: str | None) -> dict[str, dict[str, Any]]:
    """``--group GROUP``'s view of the record, or every group's (groupviews.group_views)."""
    from .groupviews import group_view, group_views

    if group is None:
        return group_views(record)
    return {group: group_view(record, group, "")}


def _status_asleep(args: argparse.Namespace, record: dict[str, Any], st: PoolStatus) -> int:
    """A pool sleeping at zero nodes: nothing to contact; when it fell asleep, what wakes it, and
    each wake (how long it took, what it cost). Exit 0: asleep is a healthy state."""
    from . import sleep

    name = record["name"]
    out = {**_summary(record, st), "nodes": [],
           "clients": [{k: c.get(k) for k in ("who", "pid", "since")} for c in record.get("clients", [])],
           "probe": {"live": False, "at": None, "age_seconds": None}, "wakes": sleep.wakes(name)}
    if args.json:
        print_json(out)
        return EXIT_OK
    since = out["asleep_since"]
    ago = "" if since is None else f" for {_duration(time.time() - float(since))}"
    expiry = ("never expires (ttl 0)" if not out["ttl"] else "expires once a client leaves" if st.expires is None
              else f"removed in {_duration(st.expires - time.time())} unless a program attaches")
    print(f"pool {name!r}: asleep{ago}, {record.get('provider')}, 0/{out['max_nodes']} node(s), "
          f"ttl {record.get('ttl')} s, {len(out['clients'])} client(s) attached")
    print(f"no node runs and it costs nothing; a program's first task wakes it "
          f"(sky.Compute(name={name!r})); it {expiry}.")
    _print_wakes(name)
    return EXIT_OK


def _print_wakes(name: str) -> None:
    from . import sleep

    woke = sleep.wakes(name)
    if not woke:
        print("it has not woken yet")
        return
    rows = [[time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(w["at"] or 0))),
             "-" if w["seconds"] is None else f"{float(w['seconds']):.2f} s", str(w["nodes"] or "-"),
             "awake now" if w["awake_seconds"] is None else _duration(float(w["awake_seconds"])),
             money(w["cost"])] for w in woke[-10:]]
    print(f"\nwakes ({len(woke)}, the last {len(rows)}):" if len(woke) > len(rows) else "\nwakes:")
    print(format_table(["WOKE", "TOOK", "NODES", "AWAKE FOR", "COST"], rows))


def cmd_history(args: argparse.Namespace) -> int:
    from ..records import audit, record
    from .pools import check_name, stack_history

    if args.name is None or record.exists(args.name):
        from .recordcli import history

        return history(args)
    check_name(args.name)
    if args.verify and audit.exists(args.name):  # a pool taken down keeps its trail: check it
        from .recordcli import verify

        return verify(args, args.name)
    entries = [] if args.verify else audit.read(args.name)
    if not entries:
        raise PoolNotFoundError(
            f"no history for a pool named {args.name!r}: nothing was ever recorded under that "
            f"name here (`skyward ls` lists running pools)."
        )
    # Cloud pools: each stack's Pulumi updates, on the entry that first names the stack.
    stacks = stack_history(args.name)
    for e in entries:
        if e.get("stack") in stacks and "stack_updates" not in e:
            e["stack_updates"] = stacks.pop(e["stack"])
    if args.json:
        print_json(entries)
        return EXIT_OK
    skip = {"time", "who", "event", "name", "pid", "skyward", "stack_updates"}
    rows = []
    for e in entries:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["time"]))
        details = ", ".join(f"{k}={e[k]}" for k in sorted(e) if k not in skip)
        rows.append([when, e.get("who", "?"), e.get("event", "?"), details])
    print(format_table(["WHEN", "WHO", "WHAT", "DETAILS"], rows))
    for e in entries:
        if e.get("stack_updates"):
            print(f"\nstack {e['stack']}: Pulumi updates, newest first")
            print(format_table(["KIND", "RESULT", "START", "END", "CHANGES"], [
                [str(u.get("kind")), str(u.get("result", u.get("message", ""))), str(u.get("start") or "-"),
                 str(u.get("end") or "-"), ", ".join(f"{k} {v}" for k, v in (u.get("changes") or {}).items())]
                for u in e["stack_updates"]]))
    return EXIT_OK


def cmd_preview(args: argparse.Namespace) -> int:
    from .pools import spec_from

    running = _running_record(args.name) if args.name is not None else None
    try:
        cfg = _load(args) if args.name is not None else _flags_only(args)
    except ConfigError:
        if running is None:
            raise
        from .config import PoolConfig  # started with flags only: preview what runs

        cfg = PoolConfig(args.name, dict(running["config"]), ("the running pool's settings",))
    # Without a name, the pool is described by the flags alone and named by nothing.
    name: str | None = cfg.name if args.name is not None else None
    label = f"pool {name!r}" if name is not None else "a pool of " + " ".join(_flag_words(args))
    if getattr(cfg, "groups", None):
        return _preview_groups(args, cfg, name, label, running)
    spec, _ = spec_from(cfg.data)
    provider = spec.provider
    why = provider.check(spec)
    if why is not None:
        raise ProviderError(f"{label} cannot be provisioned: {why}.")
    # A provider may offer preview(spec) -> {"resources": [{"type", "name", "detail"}, ...]}:
    # what `up` would create, creating nothing (a cloud: a Pulumi preview of the stack).
    preview = getattr(provider, "preview", None)
    nodes = spec.node_spec.desired
    per_node = provider.hourly_cost(spec)
    if preview is None and provider.kind != "local":
        offer = getattr(provider, "offer", None)
        would = f" It would use {offer(spec)}" if offer is not None else ""
        cost = "" if per_node is None else f", {money(per_node * nodes)}/h for {nodes} node(s)"
        raise ProviderError(
            f"preview of the resources is not available for provider {provider.kind!r} in this "
            f"version of skyward (sky.{type(provider).__name__} has no preview).{would}{cost}."
        )
    if preview is not None:
        plan: dict[str, Any] = preview(spec, name=name)
    else:
        plan = {"resources": [{"type": "process", "name": f"agent node-{i}",
                               "detail": "agent process on this machine, own working directory"}
                              for i in range(nodes)]}
    out = {"name": name, "provider": provider.kind, "nodes": nodes, "ttl": spec.ttl,
           "accelerator": None if spec.accelerator is None else str(spec.accelerator),
           "hourly_cost_per_node": per_node,
           "hourly_cost": None if per_node is None else round(per_node * nodes, 4),
           "sources": list(cfg.sources), **plan}
    if running is not None:
        out["notes"] = [*out.get("notes", []), _running_note(running)]
    if args.json:
        print_json(out)
        return EXIT_OK
    print(f"{label} would be {nodes} {provider.kind} node(s)"
          + (f" with {spec.accelerator}" if spec.accelerator is not None else "")
          + f", ttl {spec.ttl} s, {money(out['hourly_cost'])}/h (nothing was created)")
    offer = out.get("offer")
    if offer:  # a cloud pool: the catalogue offer its nodes are priced from, and its stack
        print(f"  offer {offer['instance_type']} in {offer['zone'] or offer['region']}, {offer['market']}, "
              f"{money(offer['hourly_cost_per_node'])}/h per node; stack {out.get('stack')}")
    for r in out.get("resources", []):
        print(f"  + {r.get('type')}  {r.get('name')}  {r.get('detail', '')}".rstrip())
    for note in out.get("notes", []):
        print(f"note: {note}")
    return EXIT_OK


def _preview_groups(args: argparse.Namespace, cfg: Any, name: str | None, label: str,
                    running: dict[str, Any] | None) -> int:
    """``skyward preview`` of a pool of several groups: each group's nodes, price and what its
    provider would create (groups on one cloud share one stack: its network is listed once per
    group here, made once by ``up``)."""
    from .pools import spec_from

    groups = []
    for group, data in cfg.groups.items():
        spec, _ = spec_from(data)
        provider = spec.provider
        why = provider.check(spec)
        if why is not None:
            raise ProviderError(f"group {group!r} of {label} cannot be provisioned: {why}.")
        nodes, per_node = spec.node_spec.desired, provider.hourly_cost(spec)
        preview = getattr(provider, "preview", None)
        if preview is not None:
            plan: dict[str, Any] = preview(spec, name=name)
        elif provider.kind == "local":
            plan = {"resources": [{"type": "process", "name": f"agent {group} node-{i}",
                                   "detail": "agent process on this machine, own working directory"}
                                  for i in range(nodes)]}
        else:
            plan = {"resources": [], "notes": [f"provider {provider.kind!r} has no preview of its resources"]}
        groups.append({"name": group, "head": group == (cfg.head or next(iter(cfg.groups))),
                       "provider": provider.kind, "nodes": nodes, "ttl": spec.ttl,
                       "accelerator": None if spec.accelerator is None else str(spec.accelerator),
                       "hourly_cost_per_node": per_node,
                       "hourly_cost": None if per_node is None else round(per_node * nodes, 4), **plan})
    costs = [g["hourly_cost"] for g in groups]
    out: dict[str, Any] = {"name": name, "nodes": sum(g["nodes"] for g in groups), "groups": groups,
                           "hourly_cost": None if None in costs else round(sum(costs), 4),
                           "sources": list(cfg.sources)}
    if running is not None:
        out["notes"] = [_running_note(running)]
    if args.json:
        print_json(out)
        return EXIT_OK
    print(f"{label} would be {out['nodes']} node(s) in {len(groups)} groups, {money(out['hourly_cost'])}/h "
          f"(nothing was created)")
    for g in groups:
        print(f"group {g['name']!r}{' (head)' if g['head'] else ''}: {g['nodes']} {g['provider']} node(s)"
              + (f" with {g['accelerator']}" if g["accelerator"] else "") + f", {money(g['hourly_cost'])}/h")
        for r in g.get("resources", []):
            print(f"  + {r.get('type')}  {r.get('name')}  {r.get('detail', '')}".rstrip())
        for note in g.get("notes", []):
            print(f"  note: {note}")
    for note in out.get("notes", []):
        print(f"note: {note}")
    return EXIT_OK


def _flags_only(args: argparse.Namespace) -> Any:
    """`skyward preview --provider aws --accelerator T4`: defaults.toml and the flags, no name."""
    from .config import load_flags

    flags = _flags(args)
    if not flags:
        raise ConfigError(
            "skyward preview needs a pool name or flags that describe a pool: `skyward preview NAME`, "
            "or e.g. `skyward preview --provider aws --accelerator T4 --nodes 2`."
        )
    if args.config is not None:
        raise ConfigError(
            f"--config {args.config} is read for named pools only: `skyward preview NAME --config "
            f"{args.config}`, or leave --config out to preview the flags alone."
        )
    return load_flags(flags)


def _flag_words(args: argparse.Namespace) -> list[str]:
    return [f"--{k.replace('_', '-')} {':'.join(map(str, v)) if isinstance(v, list) else v}"
            for k, v in _flags(args).items()]


def _running_record(name: str) -> dict[str, Any] | None:
    """The record of pool ``name`` when it runs now (None: not registered, or gone)."""
    from . import registry
    from .pools import status_of

    record = registry.read(name) if registry.NAME_RULE.match(name) else None
    return record if record is not None and not status_of(record).gone else None


def _running_note(record: dict[str, Any]) -> str:
    name = record["name"]
    nodes = len((record.get("cluster") or {}).get("nodes", []))
    age = _duration(time.time() - float(record.get("created", time.time())))
    who = (record.get("owner") or {}).get("who", "?")
    return (f"pool {name!r} is running now ({nodes} {record.get('provider')} node(s), started by {who} "
            f"{age} ago): `skyward up {name}` would refuse until `skyward down {name}`; attach to it "
            f"with sky.Compute(name={name!r}).")


def cmd_offers(args: argparse.Namespace) -> int:
    if args.provider == "slurm":
        return _slurm_offers(args)
    try:
        from .. import catalogue
        query = catalogue.offers
    except (ImportError, AttributeError):
        raise ProviderError(
            "offers is not available in this version of skyward: the offer catalogue is not "
            "installed. Local pools cost nothing; SSH pools use the hosts you give them."
        ) from None
    found = query(args.accelerator, provider=args.provider, vcpus=args.vcpus,
                  memory_gb=args.memory_gb, region=args.region, allocation=args.allocation,
                  max_hourly_cost=args.max_hourly_cost)
    rows = [_offer_dict(o, args.allocation) for o in list(found)[: args.limit]]
    if args.json:
        print_json(rows)
        return EXIT_OK
    if not rows:
        from ..accelerators import parse

        wanted = None if args.accelerator is None else parse(args.accelerator)
        if wanted is not None and not catalogue.renters(wanted.name):  # a card no cloud rents: who does
            print(f"no offers: {catalogue.rented_by(wanted, 'the catalogue')}")
        else:
            print("no offers match; loosen the filters (`skyward offers --help`)")
        return EXIT_FAILED
    print(format_table(
        ["PROVIDER", "TYPE", "REGION", "VCPUS", "MEM GB", "ACCELERATOR", "$/H", "SPOT", "ON-DEMAND"],
        [[r["provider"], r["instance_type"], r["region"], f"{r['vcpus']:g}", f"{r['memory_gb']:g}",
          f"{r['accelerator_count']:g}x {r['accelerator']}" if r["accelerator"] else "-",
          money(r["price"]), money(r["spot"]), money(r["on_demand"])] for r in rows],
    ))
    print(_prices_date(rows))
    return EXIT_OK


def _slurm_offers(args: argparse.Namespace) -> int:
    """`skyward offers --provider slurm`: the cluster's partitions as sinfo shows them now, asked
    on the login node that --login or skyward.toml names; price 0 (the site's allocation)."""
    from .. import catalogue

    provider = _slurm_provider(args)
    found = catalogue.offers(args.accelerator, provider=provider, vcpus=args.vcpus, memory_gb=args.memory_gb)
    rows = [{**_offer_dict(o, args.allocation), **{k: v for k, v in (o.extra or {}).items() if k != "gres"}}
            for o in list(found)[: args.limit]]
    if args.json:
        print_json(rows)
        return EXIT_OK
    if not rows:
        print(f"no partition of {provider.login} has nodes with what was asked; `skyward offers --provider "
              f"slurm` without filters lists them all")
        return EXIT_FAILED
    print(format_table(
        ["PARTITION", "NODES", "IDLE", "CPUS", "MEM GB", "GPUS", "TIME LIMIT"],
        [[r["instance_type"] + (" (default)" if r.get("default") else ""), str(r.get("nodes", "-")),
          str(r.get("idle", "-")), f"{r['vcpus']:g}", f"{r['memory_gb']:g}",
          f"{r['accelerator_count']:g}x {r['accelerator']}" if r["accelerator"] else "-",
          str(r.get("time_limit") or "-")] for r in rows],
    ))
    print(f"from sinfo on {provider.login}, now; per node; Slurm pools cost the site's allocation, not dollars.")
    return EXIT_OK


def _slurm_provider(args: argparse.Namespace) -> Any:
    from .config import defined_pools, describe_source
    from .pools import provider_from

    if args.login:
        from ..providers.slurm import Slurm

        return Slurm(args.login, key=args.key)
    slurm = {name: table for name, table in defined_pools().items()
             if isinstance(table, dict) and table.get("provider") == "slurm"}
    if args.pool:
        if args.pool not in slurm:
            raise ConfigError(f"--pool {args.pool}: {describe_source()} defines no Slurm pool of that name"
                              + (f" (its Slurm pools: {', '.join(sorted(slurm))})." if slurm else "."))
        slurm = {args.pool: slurm[args.pool]}
    if len(slurm) != 1:
        which = (f"{describe_source()} defines several Slurm pools ({', '.join(sorted(slurm))}): pick one with "
                 f"--pool NAME" if slurm else f"{describe_source()} defines no Slurm pool")
        raise ConfigError(f"offers --provider slurm asks a cluster's login node: {which}, or name it with "
                          f"--login user@host (and --key).")
    ((_name, table),) = slurm.items()
    return provider_from({"provider": "slurm", "slurm": table.get("slurm") or {}})


def _prices_date(rows: list[dict[str, Any]]) -> str:
    """When the catalogue's prices were taken: they are a snapshot shipped with skyward."""
    dates: dict[str, set[str]] = {}
    for r in rows:
        dates.setdefault(str(r.get("as_of") or "an unknown date"), set()).add(str(r["provider"]))
    when = ", ".join(f"{d} ({', '.join(sorted(p))})" if len(dates) > 1 else d for d, p in sorted(dates.items()))
    return (f"prices as of {when}, from the catalogue shipped with skyward; the cloud's own price "
            f"list is the authority.")


def _offer_dict(offer: Any, allocation: str) -> dict[str, Any]:
    keys = ("provider", "instance_type", "region", "vcpus", "memory_gb", "architecture",
            "accelerator", "accelerator_count", "accelerator_memory_gb", "spot", "on_demand", "as_of")
    return {**{k: getattr(offer, k, None) for k in keys}, "price": offer.price(allocation)}


@contextlib.contextmanager
def _attached(name: str) -> Iterator[Pool]:
    from ..spec import Options
    from .pools import attach, for_a_look

    record = for_a_look(name)
    pool = attach(record, Options(console="silent", logging=False), audited=False)
    try:
        yield pool
    finally:
        pool.close()


def cmd_exec(args: argparse.Namespace) -> int:
    from ..core.function import function
    from ..records import audit
    from .nodeops import run_shell

    cmd = list(args.cmd)
    if not cmd:
        raise ConfigError("exec needs a command after --, e.g. `skyward exec NAME -- hostname`.")
    command = cmd[0] if len(cmd) == 1 else shlex.join(cmd)
    from .groupviews import group_view
    from .pools import get
    from .wake import awake

    if args.group is not None:
        group_view(get(args.name), args.group, "")  # an unknown group fails before anything connects
    where = f"group {args.group!r} of {args.name!r}" if args.group else repr(args.name)
    with awake(args.name, wake=not args.no_wake, command="skyward exec"), \
            _progress(f"running {command!r} on every node of {where}"), _attached(args.name) as pool:
        target = pool if args.group is None else pool[args.group]
        results = function(run_shell, timeout=args.timeout + 10)(command, args.timeout) @ target
        groups = [g for g in pool.groups.values() if args.group in (None, g.name)]
        reached = [(g.name, ch.node) for g in groups if g.members.size() or args.group
                   for ch in g.members.channels]
        missing = {(g.name, i): why for g in groups for i, why in g.cluster.unreachable().items()}
    from .groupviews import group_views
    from .registry import read

    record = read(args.name) or {}
    grouped = bool(record.get("groups"))
    described = {g: (v.get("cluster") or {}).get("nodes", []) for g, v in group_views(record).items()}
    rank = {(g, int(n["index"])): i for g, nodes in described.items() for i, n in enumerate(nodes)}
    for r, key in zip(results, reached, strict=False):
        r["node"] = rank.get(key, key[1])
        if grouped:
            r["group"] = key[0]
    for key, why in missing.items():  # a node that cannot be reached fails on its own line
        results.append({"node": rank.get(key, key[1]), "hostname": described[key[0]][rank[key]].get("hostname")
                        if key in rank else None, "exit_code": None, "stdout": "", "stderr": "", "error": why,
                        **({"group": key[0]} if grouped else {})})
    order = list(described)
    results.sort(key=lambda r: (order.index(r["group"]) if "group" in r else 0, r["node"]))
    audit.append(args.name, "exec", record.get("id", ""), command=command,
                 exit_codes=[r["exit_code"] for r in results], **({"group": args.group} if args.group else {}))
    # What the nodes printed goes out with the pool's secrets masked (attaching registered its
    # secret env values here): `skyward exec NAME -- env` must not show them.
    if args.json:
        print_json(results)
    else:
        for r in results:
            label = f"{r['group']} " if "group" in r else ""
            if r["exit_code"] is None and r.get("error"):
                say(f"[{label}node {r['node']} {r['hostname']}] not run: {r['error']}")
                continue
            print(f"[{label}node {r['node']} {r['hostname']}] exit {r['exit_code']}")
            for stream in (r["stdout"], r["stderr"]):
                if stream:
                    say(stream.rstrip("\n"))
    return EXIT_OK if all(r["exit_code"] == 0 for r in results) else EXIT_FAILED


def cmd_logs(args: argparse.Namespace) -> int:
    if args.follow:
        from .follow import follow

        return follow(args)
    from ..core.function import function
    from .nodeops import tail
    from .pools import get

    record = get(args.name)
    grouped = bool(record.get("groups"))
    views = _selected_groups(record, args.group)
    if args.node is not None and grouped and args.group is None:
        raise ConfigError(f"--node {args.node}: pool {args.name!r} has several groups ({', '.join(map(repr, views))}); "
                          f"give --group GROUP with it (--node is then the rank within that group).")
    described = {g: (v.get("cluster") or {}).get("nodes", []) for g, v in views.items()}
    for g, nodes in described.items():
        if args.node is not None and not 0 <= args.node < len(nodes):
            whose = f"group {g!r} of pool {args.name!r}" if grouped else f"pool {args.name!r}"
            raise ConfigError(f"--node {args.node}: {whose} has nodes 0 to {len(nodes) - 1}.")
    out = []
    with _attached(args.name) as pool:
        for g, nodes in described.items():
            group = pool.groups[g] if grouped else pool.head_group
            target = {ch.node: r for r, ch in group.members.ranked()}  # the live nodes' ranks here
            missing = group.cluster.unreachable()
            for rank, node in enumerate(nodes):
                if args.node is not None and rank != args.node:
                    continue
                path = node.get("log")
                why = ("this provider does not say where its agent log is" if not path else
                       missing.get(int(node["index"]), "not attached") if int(node["index"]) not in target else None)
                label = {"group": g} if grouped else {}
                if why is not None:
                    out.append({**label, "node": rank, "hostname": node.get("hostname"), "path": path, "text": "",
                                "error": why})
                    continue
                found: dict[str, Any] = pool[group.name].run(function(tail)(path, args.lines),
                                                             target=target[int(node["index"])])
                out.append({**label, "node": rank, **found})
    if args.json:
        print_json(out)
    else:
        for r in out:
            who = f"{r['group']} " if "group" in r else ""
            print(f"== {who}node {r['node']} ({r['hostname']}) {r['path'] or ''} ==")
            say(r["error"] if r["error"] else r["text"].rstrip("\n"))
    return EXIT_FAILED if any(r["error"] for r in out) else EXIT_OK


def cmd_resize(args: argparse.Namespace) -> int:
    """``skyward resize NAME [--group GROUP] N``: attach, change the group's size, wait for it,
    write the nodes it has now to the registry, detach (the nodes stay)."""
    from ..records import audit
    from ..spec import Nodes, Options
    from . import registry
    from .config import parse_nodes
    from .groupviews import group_view
    from .pools import _describe_groups, attach, for_a_look, get, status_of

    record = get(args.name)
    if not status_of(record).asleep:
        record = for_a_look(args.name)  # a pool being provisioned, or gone, cannot be resized
    view = group_view(record, args.group, "skyward resize NAME N")
    group = view.get("group", DEFAULT_GROUP_NAME)
    size = 0 if args.nodes.strip() == "0" else parse_nodes(args.nodes)
    nodes = size if isinstance(size, int) else Nodes(desired=size[0], max=size[1])
    desired = 0 if nodes == 0 else Nodes.of(nodes).desired
    with _progress(f"resizing {'group ' + repr(group) + ' of ' if record.get('groups') else ''}pool "
                   f"{args.name!r} to {desired} node(s)"), \
            contextlib.closing(attach(record, Options(console="silent", logging=False), audited=False,
                                      sleeps=False)) as pool:
        target = pool[group]
        target.resize(nodes)
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            if target.current_nodes() == desired and len(target.group.cluster.describe()["nodes"]) == desired:
                break
            time.sleep(0.1)
        else:
            raise ProviderError(f"pool {args.name!r}: group {group!r} has {target.current_nodes()} node(s) after "
                                f"{args.timeout:g} s, not {desired}; `skyward status {args.name}` shows them.")

        def store(r: dict[str, Any]) -> None:
            if r.get("groups"):
                _describe_groups(r, pool)
            else:
                r["cluster"] = pool.cluster.describe()

        registry.update(args.name, store)
    audit.append(args.name, "resized", record.get("id", ""), nodes=desired, by="skyward resize",
                 **({"group": group} if record.get("groups") else {}))
    if args.json:
        print_json({"name": args.name, "group": group, "nodes": desired})
    else:
        print(f"pool {args.name!r}: {'group ' + repr(group) + ' ' if record.get('groups') else ''}now has "
              f"{desired} node(s)" + (" (asleep: a task sent to it wakes it)" if desired == 0 else "") + ".")
    return EXIT_OK


DEFAULT_GROUP_NAME = "default"


def cmd_reproduce(args: argparse.Namespace) -> int:
    from .recordcli import reproduce

    return reproduce(args)


def cmd_diff(args: argparse.Namespace) -> int:
    from .recordcli import diff

    return diff(args)
