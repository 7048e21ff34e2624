"""``sky.SSH(fanout=True)``: the pool's first node starts the others, so the client logs into one.

The client brings the first node up as any other (its own login), then runs
``skyward.bootstrap.fanout`` there with its ssh-agent forwarded (bootstrap/agentfwd.py: the
client's keys sign, they are never sent). That program logs into the other hosts with OpenSSH
and runs on each the command the client would have run; each host's lines come back tagged with
its node's index and are read exactly as a login of the client's own is read
(ssh._UpReader). Each agent it starts listens on its host's private address (sealed links,
bootstrap/frames.py), where the client reaches it: straight with ``direct=True``, else through
the first node's SSH connection (one login carries every node's link: a cloud pool seen from
outside its network), all the links in one channel of it through the multiplexer the client
starts there (bootstrap/mux.py; a direct-tcpip channel each where it cannot run). The client
logs into a node later only when something needs its SSH (a stream the direct port refuses,
``skyward ssh``, a replacement). Releasing the pool goes through the first node the same way.

A host is started by the first node when the client could have: a private IP address the
first node logs into and the agent listens on (``SSHHost.private_ip``, a cloud node's address
in its network, else the address the client uses), no jump host, a user, and a host key the
client already trusts (given, or in a known_hosts file it reads: the first node accepts only
those keys). The others, and any host the first node could not log into (``ssh`` exits 255
before the host printed anything), are started by the client's own login, as without fan-out.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from skyward.bootstrap.fanout import LACKS
from skyward.errors import ProviderError

if TYPE_CHECKING:
    import paramiko

    from skyward.bootstrap.remote import Remote

    from .base import NodeEndpoint
    from .ssh import SSHCluster, _Node, _UpReader

log = logging.getLogger("skyward.ssh")

PARALLEL = 32  # logins the first node makes at once
_SSH_OPTIONS = [
    "-F", "/dev/null", "-T", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
    "-o", "GlobalKnownHostsFile=/dev/null", "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=15",
    # OpenSSH 9's default (sntrup761x25519 first) costs the first node about 100 ms of CPU per
    # login against about 17 for curve25519 (benchmarks.md): curve25519 first, then what any
    # sshd of the last ten years offers (names an older ssh does not know would fail the login).
    "-o", "KexAlgorithms=curve25519-sha256,curve25519-sha256@libssh.org,ecdh-sha2-nistp256,"
          "diffie-hellman-group16-sha512,diffie-hellman-group14-sha256",
]


class Fallback(Exception):
    """This host is started by the client's own login after all (why: the message)."""


@dataclass
class Dest:
    """How the first node reaches a host: ssh's options up to the host, and its known_hosts lines."""

    argv: list[str]
    known: list[str]


def destination(cluster: SSHCluster, node: _Node) -> Dest | str:
    """Where the first node logs into ``node``'s host, or why it cannot (the client logs in).
    Read from ``~/.ssh/config`` as the client's login reads it (its parsed copy: no Fabric
    connection is built per host) and from the known_hosts files it trusts."""
    import base64
    import getpass
    from pathlib import Path

    import paramiko

    from skyward.bootstrap.remote import (
        host_key_name,
        known_hosts_path,
        ssh_config_for,
        trusted_keys,
    )

    if node.fan is not None:
        return node.fan
    h = node.host
    if h.jump:
        return "it is reached through a jump host"
    try:
        config = ssh_config_for(h.address)
    except Exception as exc:  # a broken ~/.ssh/config: the client's login says what
        return f"its ssh configuration cannot be read ({exc})"
    if config.get("proxyjump") or config.get("proxycommand"):
        return "~/.ssh/config reaches it through a proxy"
    known_as = str(config.get("hostname") or h.address)  # (the name its known_hosts lines carry)
    host = h.private_ip or known_as  # where the first node logs in and the agent listens
    if cluster.direct_address(h, host) is None:
        return "its address is not private (give SSHHost(private_ip=...): the address other hosts reach it at)"
    port = int(h.port or config.get("port") or 22)
    user = h.user or config.get("user") or getpass.getuser()
    try:
        if h.host_key:
            kind, blob = h.host_key.split()[:2]
            keys = [paramiko.PKey.from_type_string(kind, base64.b64decode(blob))]
        else:
            ours = Path(cluster._known_hosts).expanduser() if cluster._known_hosts else known_hosts_path()
            keys = trusted_keys(known_as, port, config, ours)
    except Exception as exc:
        return f"its host keys cannot be read ({exc})"
    if not keys:
        return "its host key is not known yet (the client logs in once and records it)"
    name = host_key_name(host, port)
    node.fan = Dest(["-p", str(port), "-l", str(user), host], [f"{name} {k.get_name()} {k.get_base64()}" for k in keys])
    return node.fan


def client_keys(nodes: list[_Node]) -> list[paramiko.PKey]:
    """The keys the client logs into these hosts with: each host's key file, else the keys of
    the client's own ssh-agent (which signs for them there)."""
    from pathlib import Path

    from skyward.bootstrap.remote import _private_key

    keys: list[Any] = []
    files = {h.key for h in (n.host for n in nodes)}
    for path in files:
        if path is None:
            continue
        key = _private_key(Path(path).expanduser())
        if key is not None and all(key.asbytes() != k.asbytes() for k in keys):
            keys.append(key)
    if None in files:
        try:
            import paramiko

            keys += [k for k in paramiko.Agent().get_keys() if all(k.asbytes() != x.asbytes() for x in keys)]
        except Exception as exc:
            log.debug("no ssh-agent keys to forward: %s", exc)
    return keys


class FanOut:
    """Starts ``rest`` through ``first``: ``endpoint(node)`` waits for a node's start (raising
    Fallback when the client must start it itself)."""

    def __init__(self, cluster: SSHCluster, first: _Node, rest: dict[int, tuple[_Node, Dest]],
                 bring_up: Any, ready: Future[None]) -> None:
        self.cluster, self.first = cluster, first
        self.nodes = {i: n for i, (n, _) in rest.items()}
        self.rest = {i: d for i, (_, d) in rest.items()}
        self._bring_up, self._ready = bring_up, ready
        self.futures: dict[int, Future[NodeEndpoint]] = {first.index: Future()}
        self.futures.update({i: Future() for i in rest})
        self._thread = threading.Thread(target=self._run, name="skyward-ssh-fanout", daemon=True)
        self._thread.start()

    def endpoint(self, node: _Node) -> NodeEndpoint:
        return self.futures[node.index].result()

    def _run(self) -> None:
        self._heard = False  # a line from the first node's program: it runs, the hosts are being started
        first = self.futures[self.first.index]
        try:
            endpoint = self._bring_up(self.first, None, self._ready)
        except BaseException as exc:
            first.set_exception(exc)
            self._fall_back(f"the first node did not start ({exc})")
            return
        first.set_result(endpoint)
        try:
            self._start_rest()
        except BaseException as exc:
            if self._heard:  # timed out or cut off while the hosts start: a login now would race them
                for future in self.futures.values():
                    if not future.done():
                        future.set_exception(exc)
                return
            # the program could not run at all: the client starts the rest
            log.warning("the first node could not start the other hosts (%s); the client logs into each", exc)
            self._fall_back(str(exc))

    def _fall_back(self, why: str) -> None:
        for future in self.futures.values():
            if not future.done():
                future.set_exception(Fallback(why))

    def _start_rest(self) -> None:
        from skyward.bootstrap.agentfwd import KeyAgent

        cluster, first = self.cluster, self.first
        remote = first.remote
        assert remote is not None and cluster._ship is not None
        nodes = self.nodes
        keys = client_keys([first, *nodes.values()])
        if not keys:
            raise ProviderError("no key of the client's to forward (no key file, no ssh-agent)")
        readers: dict[int, _UpReader] = {}
        lines: dict[int, list[str]] = {}
        jobs, blobs = [], []
        for i, node in nodes.items():
            dest = self.rest[i]
            node.agent_python = cluster._ship.agent_python
            node.fanned_by = first  # (its agent listens on the private address: _agent_start)
            command, stdin = cluster._up_command(node, dest.argv[-1], cluster._ship)
            readers[i] = cluster.up_reader(node)
            lines[i] = []
            jobs.append({"i": i, "dest": dest.argv, "command": command, "stdin": len(stdin), "answer": True})
            blobs.append(stdin)
        plan = {"ssh": _SSH_OPTIONS, "parallel": PARALLEL, "sky": first.home, "jobs": jobs,
                "known_hosts": "".join(line + "\n" for d in self.rest.values() for line in d.known)}
        agent = KeyAgent(keys)

        def on_line(raw: str) -> None:
            if not raw.startswith("@@fan "):
                if raw.strip():
                    log.debug("fan-out on node %d: %s", first.index, raw)
                return
            _, index, line = (raw + " ").split(" ", 2)
            i = int(index)
            line = line[:-1]
            self._heard = True
            if i not in readers:
                return
            if line.startswith("@@exit "):
                self._finish(nodes[i], readers.pop(i), int(line.split()[1]), lines.pop(i), self.rest[i])
                return
            lines[i].append(line)
            if len(lines[i]) > 200:
                del lines[i][:-100]
            readers[i].on_line(line)

        limit = time.monotonic() + cluster._ssh_timeout + cluster._bootstrap_timeout + cluster.agent_start_timeout + 60
        command = f"exec {shlex_quote(first.home + '/' + first.agent_python)} -m skyward.bootstrap.fanout"
        stdin = b"".join([json.dumps(plan).encode(), b"\n", *blobs])
        try:
            code, out = remote.run(command, stdin=stdin, check=False, on_line=on_line, forward_agent=agent,
                                   deadline=lambda: limit, phase="fan-out")
        finally:
            agent.close()
        log.debug("fan-out through node %d: %d signatures, exit %d", first.index, agent.signed, code)
        for i in list(readers):  # never reported: the helper died
            lines_i = lines.pop(i)
            readers.pop(i)
            self.futures[i].set_exception(Fallback(f"the first node's helper ended (exit {code}) before "
                                                   f"host {nodes[i].host.address} did: {lines_i[-1:] or out[-200:]}"))

    def _finish(self, node: _Node, reader: _UpReader, code: int, output: list[str], dest: Dest) -> None:
        future = self.futures[node.index]
        if code == 255 and not reader.seen and "home" not in reader.facts and not node.home:
            # ssh itself failed (no login): the client tries its own, which says why if it fails too
            future.set_exception(Fallback(f"the first node could not log in: {' '.join(output[-2:])}"))
            return
        if any(line.startswith(LACKS) for line in output):  # (a file of the shipment the first node lacks)
            future.set_exception(Fallback("the first node lacks a file this host needs"))
            return
        try:
            reader.check(code, output, f"node {node.index} ({node.host.address})", node.host.user)
            port, pid, facts = self.cluster._agent_hello(node, None, reader.facts)
            future.set_result(self.cluster._fanned_endpoint(node, dest.argv[-1], port, pid, facts))
        except BaseException as exc:
            future.set_exception(exc)


def shlex_quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def run_on_rest(remote: Remote, first: _Node, jobs: list[tuple[_Node, Dest, str]], timeout: float) -> dict[int, int]:
    """Run a command on each host through the first node (a release): exit code per node index
    (255: not reached; the caller logs in itself)."""
    from skyward.bootstrap.agentfwd import KeyAgent

    keys = client_keys([first, *(n for n, _, _ in jobs)])
    if not keys:
        return {}
    plan = {"ssh": _SSH_OPTIONS, "parallel": PARALLEL, "sky": first.home,
            "jobs": [{"i": n.index, "dest": d.argv, "command": c, "stdin": 0} for n, d, c in jobs],
            "known_hosts": "".join(line + "\n" for _, d, _ in jobs for line in d.known)}
    codes: dict[int, int] = {}

    def on_line(raw: str) -> None:
        if raw.startswith("@@fan "):
            _, index, line = (raw + " ").split(" ", 2)
            if line.startswith("@@exit "):
                codes[int(index)] = int(line.split()[1])

    agent = KeyAgent(keys)
    try:
        remote.run(f"exec {shlex_quote(first.home + '/' + first.agent_python)} -m skyward.bootstrap.fanout",
                   stdin=json.dumps(plan).encode() + b"\n", check=False, on_line=on_line, forward_agent=agent,
                   timeout=timeout, phase="release")
    finally:
        agent.close()
    return codes
