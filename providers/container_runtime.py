"""The container runtime's command line, as sky.Container uses it (podman; docker and nerdctl
take the same words for everything here).

Every call goes through ``Runtime.run``: a failure becomes a ``ProviderError`` that quotes what
the runtime said and, where the cause is a known one (no such binary, no daemon, a rootless user
without subordinate ids, an image that is not there), says how to fix it.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from skyward.errors import ProviderError

# The pools' own networks take a free /24 out of this range: not podman's default (10.88.0.0/16),
# not the SSH test hosts' (10.213.0.0/16), not the clouds' usual VPC ranges.
POOL_SUBNETS = ipaddress.IPv4Network("10.217.0.0/16")
LABEL = "skyward.pool"  # on every container and network a pool makes: its pool id
_TIMEOUT = 120.0


@dataclass(frozen=True)
class Runtime:
    """One container CLI: ``binary`` is "podman", "docker", "nerdctl" or a path to one of them."""

    binary: str

    @property
    def name(self) -> str:
        return os.path.basename(self.binary)

    def path(self) -> str:
        found = shutil.which(self.binary)
        if found is None:
            raise ProviderError(
                f"sky.Container(binary={self.binary!r}): no {self.binary!r} on PATH. Install it "
                f"({_install_hint(self.name)}), or name another runtime: binary='podman', 'docker' or "
                f"'nerdctl'."
            )
        return found

    def run(
        self,
        args: Sequence[str],
        *,
        input: bytes | None = None,
        timeout: float = _TIMEOUT,
        what: str = "",
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """``binary args...``; a ProviderError naming ``what`` and the runtime's message when it fails."""
        argv = [self.path(), *args]
        try:
            proc = subprocess.run(
                argv,
                input=input.decode() if input is not None else None,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            raise ProviderError(
                f"{what or ' '.join(argv[:3])}: `{self.name} {args[0]}` did not finish "
                f"within {timeout:g} s; is the {self.name} service stuck? "
                f"(`{self.name} info` should answer at once)"
            ) from None
        if check and proc.returncode != 0:
            raise self.error(
                what or f"`{self.name} {' '.join(args[:2])}`", proc.stderr or proc.stdout
            )
        return proc

    def error(self, what: str, said: str) -> ProviderError:
        """A failure of this runtime, with its own words and the fix for the causes we know."""
        said = _last_lines(said)
        low = said.lower()
        fix = ""
        if (
            "cannot connect to the docker daemon" in low
            or "is the docker daemon running" in low
            or ("containerd.sock" in low and "no such file" in low)
        ):
            fix = (
                f"its daemon is not running here: start it (`sudo systemctl start {self.name}` or "
                f"`sudo dockerd &`), add your user to its group, or use binary='podman', which needs none."
            )
        elif "subuid" in low or "subgid" in low or "newuidmap" in low or "no subuid ranges" in low:
            user = os.environ.get("USER") or "YOUR_USER"
            fix = (
                f"rootless {self.name} needs subordinate user and group ids for {user}: "
                f"`sudo usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {user}` "
                f"(and `apt-get install uidmap` for newuidmap), then `{self.name} system migrate`."
            )
        elif any(
            s in low
            for s in (
                "image not known",
                "manifest unknown",
                "no such image",
                "repository does not exist",
                "pull access denied",
                "not found: manifest",
                "initializing source",
                "short-name",
                "failed to resolve reference",
            )
        ):
            fix = (
                f"the image is not on this machine and could not be pulled. Pull or build it first "
                f"(`{self.name} pull IMAGE`, `{self.name} build -t IMAGE .`, or `{self.name} import "
                f"ROOTFS.tar IMAGE`; `{self.name} images` lists what is here), then give its name "
                f"as sky.Container(image=...)."
            )
        elif "cgroup" in low and ("limit" in low or "not supported" in low or "rootless" in low):
            fix = (
                "this machine's cgroups do not let the runtime limit containers (rootless on cgroup v1, "
                "or a controller not delegated): drop vcpus=/memory_gb= for sky.Container here, or run "
                "on a machine with cgroup v2 and delegated cpu and memory controllers."
            )
        tail = f"\n{self.name} said:\n    " + said.replace("\n", "\n    ") if said else ""
        return ProviderError(f"{what} failed{tail}" + (f"\nHow to fix: {fix}" if fix else ""))

    # -- facts ------------------------------------------------------------------------------------
    def info(self) -> dict[str, object]:
        """What the runtime says about itself (also: is its daemon there, may this user run it)."""
        proc = self.run(
            ["info", "--format", "json"],
            what=f"`{self.name} info` (is {self.name} usable here?)",
            timeout=60,
        )
        try:
            data = json.loads(proc.stdout)
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}

    def image_exists(self, image: str) -> bool:
        args = ["image", "exists", image] if self.name == "podman" else ["image", "inspect", image]
        return self.run(args, check=False, timeout=60).returncode == 0

    def running(self, label_value: str) -> dict[str, bool]:
        """The containers of one pool (by its label): name -> running."""
        proc = self.run(
            [
                "ps",
                "-a",
                "--filter",
                f"label={LABEL}={label_value}",
                "--format",
                "{{.Names}} {{.State}}",
            ],
            check=False,
            timeout=60,
        )
        found: dict[str, bool] = {}
        for line in proc.stdout.splitlines():
            name, _, state = line.strip().partition(" ")
            if name:
                found[name] = state.strip().lower().startswith(("running", "up"))
        return found

    def address(self, container: str, network: str) -> str:
        """The container's IPv4 address on ``network``."""
        proc = self.run(
            ["inspect", "--format", "{{json .NetworkSettings.Networks}}", container],
            what=f"finding the address of container {container}",
        )
        try:
            nets = json.loads(proc.stdout.strip().splitlines()[-1])
            return str(nets[network]["IPAddress"])
        except (ValueError, KeyError, TypeError, IndexError):
            raise ProviderError(
                f"container {container} has no address on network {network!r} "
                f"({self.name} inspect said {proc.stdout.strip()[:300]!r})"
            ) from None

    # -- networks ---------------------------------------------------------------------------------
    def network_exists(self, network: str) -> bool:
        args = (
            ["network", "exists", network]
            if self.name == "podman"
            else ["network", "inspect", network]
        )
        return self.run(args, check=False, timeout=60).returncode == 0

    def create_network(self, network: str, pool_id: str) -> str:
        """A bridge network of the pool's own on a free /24 of POOL_SUBNETS; its subnet."""
        taken = self._subnets_in_use()
        for attempt in range(8):
            subnet = _free_subnet(taken, seed=int.from_bytes(os.urandom(2), "big") + attempt)
            proc = self.run(
                [
                    "network",
                    "create",
                    "--subnet",
                    str(subnet),
                    "--label",
                    f"{LABEL}={pool_id}",
                    network,
                ],
                check=False,
            )
            if proc.returncode == 0:
                return str(subnet)
            if (
                "already" not in (proc.stderr or "").lower()
                and "overlap" not in (proc.stderr or "").lower()
            ):
                raise self.error(f"creating the pool's network {network} ({subnet})", proc.stderr)
            taken.append(subnet)
        raise ProviderError(
            f"no free /24 left in {POOL_SUBNETS} for the network of pool {pool_id}; remove "
            f"unused networks (`{self.name} network prune`) or pass sky.Container(network=...)."
        )

    def _subnets_in_use(self) -> list[ipaddress.IPv4Network]:
        """The subnets of this runtime's networks and of this machine's own routes."""
        taken: list[ipaddress.IPv4Network] = []
        names = self.run(["network", "ls", "--format", "{{.Name}}"], check=False).stdout.split()
        if names:
            proc = self.run(["network", "inspect", *names], check=False)
            for text in _find_subnets(proc.stdout):
                try:
                    net = ipaddress.ip_network(text, strict=False)
                except ValueError:
                    continue
                if isinstance(net, ipaddress.IPv4Network):
                    taken.append(net)
        try:
            routes = subprocess.run(
                ["ip", "-4", "-o", "route"], capture_output=True, text=True, timeout=10
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            routes = ""
        for line in routes.splitlines():
            first = line.split(" ", 1)[0]
            if "/" in first:
                try:
                    taken.append(ipaddress.IPv4Network(first, strict=False))
                except ValueError:
                    pass
        return taken

    def remove_network(self, network: str) -> None:
        proc = self.run(["network", "rm", network], check=False)
        if proc.returncode != 0 and self.network_exists(network):
            raise self.error(f"removing the pool's network {network}", proc.stderr)

    def prune_networks(self) -> None:
        """Networks of pools whose client died (their containers removed themselves at the end of
        their lease): those that no container uses any more and that are older than ten minutes
        (a pool asleep at zero nodes makes its network again when it wakes)."""
        self.run(
            ["network", "prune", "-f", "--filter", f"label={LABEL}", "--filter", "until=10m"],
            check=False,
            timeout=60,
        )

    # -- containers -------------------------------------------------------------------------------
    def remove(self, containers: Sequence[str], *, grace: int = 2) -> None:
        """Stop (SIGTERM, then SIGKILL after ``grace`` s) and remove; gone already is fine."""
        if not containers:
            return
        proc = self.run(
            ["rm", "-f", "-t", str(grace), *containers], check=False, timeout=60 + grace
        )
        if proc.returncode != 0:
            left = [c for c in containers if c in self._names()]
            if left:
                raise self.error(f"removing container(s) {', '.join(left)}", proc.stderr)

    def _names(self) -> set[str]:
        return set(self.run(["ps", "-a", "--format", "{{.Names}}"], check=False).stdout.split())


def _free_subnet(taken: list[ipaddress.IPv4Network], seed: int) -> ipaddress.IPv4Network:
    candidates: list[ipaddress.IPv4Network] = list(POOL_SUBNETS.subnets(new_prefix=24))
    for i in range(len(candidates)):
        net = candidates[(seed + i) % len(candidates)]
        if not any(net.overlaps(t) for t in taken):
            return net
    raise ProviderError(
        f"no free /24 left in {POOL_SUBNETS}: remove unused container networks "
        f"(`podman network prune`) or pass sky.Container(network=...)."
    )


def _find_subnets(text: str) -> list[str]:
    """Every "subnet" value in ``network inspect``'s JSON (podman, docker and nerdctl nest it
    differently)."""
    found: list[str] = []

    def walk(value: object) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                if k.lower() == "subnet" and isinstance(v, str):
                    found.append(v)
                else:
                    walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    try:
        walk(json.loads(text or "[]"))
    except ValueError:
        pass
    return found


def _last_lines(text: str, n: int = 6) -> str:
    lines = [
        ln
        for ln in (text or "").strip().splitlines()
        if ln.strip() and "failed to connect to syslog" not in ln
    ]
    return "\n".join(lines[-n:])


def _install_hint(name: str) -> str:
    return {
        "podman": "Debian/Ubuntu: `sudo apt-get install podman` (runc or crun comes with it); "
        "other systems: https://podman.io/docs/installation",
        "docker": "https://docs.docker.com/engine/install/",
        "nerdctl": "https://github.com/containerd/nerdctl (with containerd running)",
    }.get(name, "see your runtime's documentation")
