"""Image -> the one bash script that prepares a node, in phases.

The script is rendered on the client from the final Image (after plugin transforms) and a
`NodePlan` (what the client shipped and where), sent to the node over SSH on stdin and run
with bash. It prints one marker line per phase transition, which the client turns into
`BootstrapPhase` events:

    @@skyward phase NAME started|done|skipped|failed [EXIT_CODE]

Everything else the phases print is ordinary output; the client keeps its last lines for the
error of a failed phase.

Node layout. Caches live in the login user's home (``$HOME/.skyward``, or ``SKYWARD_NODE_HOME``),
which on a lab cluster is one NFS directory shared by every host; whatever is about *this* node
lives on node-local disk (``/var/tmp/skyward-<uid>``, or ``SKYWARD_NODE_RUN``):

    $SKY/bin/uv                  the client's uv binary (unpacked under a unique name, renamed)
    $SKY/wheels/                 the shipped wheelhouse (skyward's wheel under wheels/skyward/<hash>/)
    $SKY/envs/<key>/             one virtualenv per (python, packages) combination, shared by pools
                                 and by the hosts of a shared home: built by one host under a lock
                                 ($SKY/locks/env-<key>), the others wait and then skip
    $SKY/done/<phase>-<key>      markers of the shared phases (uv, python, venv, deps, skyward)
    $RUN/done/<phase>-<key>      markers of this node's phases (apt, plugins)
    $RUN/pools/<pool>-<node>/    env.sh, includes/, the agent's log and handshake; removed at teardown

The client resolves ``SKY``, ``RUN`` and the node's pool folder once per node (``NODE_DIRS``) and
passes them to the script as ``SKYWARD_SKY``, ``SKYWARD_RUN`` and ``SKYWARD_POOL``.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from skyward.spec import Image

MARKER = "@@skyward"
Install = Literal["wheelhouse", "index"]

# Phase names, in the order they run.
PHASES = ("env", "apt", "uv", "python", "venv", "deps", "skyward", "includes", "shell_vars", "volumes", "plugins")


@dataclass(frozen=True, slots=True)
class NodePlan:
    """What the script needs besides the Image."""

    pool_id: str
    python: str  # "3.11": resolved from Image.python ("auto" = the client's)
    install: Install = "wheelhouse"
    skyward_wheel: str = ""  # path relative to the node home, e.g. wheels/skyward/ab12/skyward-0.1.0-...whl
    skyward_hash: str = ""  # content hash of that wheel: a new build reinstalls
    skyward_sha256: str = ""  # the wheel file's sha256 (a lock's hash line for it)
    agent_requirements: tuple[str, ...] = ()  # pinned: cloudpickle==x, lz4==y
    includes_archive: bool = False  # pools/<id>/includes.tar was uploaded
    ops: tuple[str, ...] = ()  # plugin bootstrap ops, run last, in order
    wheel_names: tuple[str, ...] = field(default=())  # the wheelhouse content (keys the deps phase)
    uv_version: str = ""  # index mode: the uv release a node fetches when it has none
    uv_lz4_size: int = 0  # wheelhouse mode: the size of the bin/uv.lz4 shipped beside uv.gz (0: none)
    volumes: str = ""  # the volumes phase (bootstrap/mounts.py): mounts the pool's sky.Volume buckets
    # The pool's lock (skyward.records.pkglock.text): installed as it is, --no-deps; replaces Image.pip.
    lock: str = ""


def key(*parts: object) -> str:
    """A short stable hash of a phase's inputs."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def env_key(image: Image, plan: NodePlan) -> str:
    """The virtualenv a node uses: one per python and package set, shared across pools."""
    indexes = [(ix.url, list(ix.packages)) for ix in image.pip_indexes]
    parts: tuple[object, ...] = (plan.python, sorted(image.pip), indexes, plan.install,
                                 sorted(plan.agent_requirements), sorted(plan.wheel_names))
    return key(*parts, plan.lock) if plan.lock else key(*parts)


def render(image: Image, plan: NodePlan) -> str:
    q = shlex.quote
    ek = env_key(image, plan)
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", plan.pool_id):
        raise ValueError(f"pool id {plan.pool_id!r}: letters, digits, '_', '.', '-' only")
    out = [_PRELUDE.format(pool=plan.pool_id, env=q("envs/" + ek))]

    def phase(name: str, body: str, phase_key: str | None = None, check: str = "true",
              node_local: bool = False) -> None:
        out.append(f"_p_{name}() {{\n{body.rstrip()}\n}}\n")
        marks = '"$RUN/done"' if node_local else '"$SKY/done"'
        out.append(f"phase {name} {q(phase_key or '')} {q(check)} {marks}\n")

    # env: exported on the node for the agent and every task (0600: values may be secrets). Each
    # `export NAME=VALUE` line is quoted twice: printf (a builtin: no process, nothing on argv)
    # writes the line as it is, and sourcing env.sh gives back VALUE literally. No heredoc: a value
    # holding its delimiter on a line of its own would end it, and the rest would run as shell.
    # (Names are shell names: spec.Image refuses any other.)
    exports = " ".join(q(f"export {k}={q(v)}") for k, v in image.env.items())
    phase("env", "umask 077\n" + (f"printf '%s\\n' {exports} > \"$POOL/env.sh\"" if exports
                                   else ': > "$POOL/env.sh"'))
    # The rest of the bootstrap sees Image.env too: an index (UV_INDEX_URL), a proxy, ...
    out.append('. "$POOL/env.sh"\n')
    if image.apt:  # (the exact commands node_dirs_command asks sudo about and sudo_advice names)
        phase("apt", _APT.format(install=_words(apt_install(image.apt)), update=_words(apt_update())),
              key(sorted(image.apt)), node_local=True)
    # Keyed by the client's uv: a warm node skips it (two uv runs fewer on every start), a client
    # with another uv runs it again.
    uv_key = key("uv", plan.install, plan.uv_version)
    if plan.install == "index":
        # Nodes with an index fetch uv themselves (nothing to upload): the client's version.
        phase("uv", f'if ! "$UV" --version >/dev/null 2>&1; then\n'
                    f'  python3 - "$SKY/bin" {q(plan.uv_version)} <<\'SKYWARD_PY\'\n{_FETCH_UV}SKYWARD_PY\nfi\n'
                    f'"$UV" --version', uv_key, '[ -x "$UV" ]')
    else:
        # Unpacked whenever the phase runs (a host without it, or a client with another uv, whose
        # uv.gz was just sent): a unique name, then rename, since on a shared home other hosts may
        # be running "$UV" while this one unpacks it ("text file busy", exit 126).
        # uv.lz4 where it came (a node with the lz4 command: 0.03 s of CPU, gunzip's 0.25), known
        # by its size: one left by another client's uv is not this one.
        unpack = 'gunzip -c "$UV.gz" > "$tmp"'
        if plan.uv_lz4_size:
            unpack = (f'if command -v lz4 >/dev/null 2>&1 && [ "$(stat -c %s "$UV.lz4" 2>/dev/null)" = '
                      f'{plan.uv_lz4_size} ]; then\n  lz4 -d -q -c "$UV.lz4" > "$tmp"\nelse\n  {unpack}\nfi')
        phase("uv", f'tmp="$UV.$(hostname).$$"\n{unpack}\n'
                    'chmod 755 "$tmp" && mv -f "$tmp" "$UV"\n"$UV" --version',
              uv_key, '[ -x "$UV" ]')
    py = q(plan.python)
    # The PATH's python3.X first: a lookup, where uv's search runs every interpreter it finds to ask
    # its version (0.1-0.2 s of a fresh node's start); uv's search only when there is none.
    find = f'command -v python{plan.python} || "$UV" python find --system {py} 2>/dev/null || true'
    if plan.install == "index":
        python_body = (
            f'PY=$({find})\nif [ -z "$PY" ]; then "$UV" python install {py}; fi\n'
            f'PY=$("$UV" python find {py})\necho "$PY" > "$SKY/envs/{ek}.python"'
        )
    else:
        python_body = (
            f'PY=$({find})\nif [ -z "$PY" ]; then\n'
            f'  echo "no Python {plan.python} on this node, and it has no package index to fetch one '
            f'from (wheelhouse mode): install python{plan.python} on it, use Image(python=...) with the '
            f'version it has, or use install=\\"index\\" on a node with internet access" >&2\n  exit 3\nfi\n'
            f'echo "$PY" > "$SKY/envs/{ek}.python"'
        )
    venv_check = '[ -x "$ENV/bin/python" ]'
    # The environment is a cache shared by pools and, on a shared home, by hosts: one host
    # builds it while the others wait on the lock, then find its markers and skip.
    out.append(f"env_lock {q(ek)}\n")
    phase("python", python_body, ek, venv_check)
    deps_key, skyward_key = key(ek, "deps"), key(ek, plan.skyward_hash)
    # A new environment has nothing installed: the markers of what was installed in the old one go.
    phase("venv", f'rm -rf "$ENV" "$SKY/done/deps-{deps_key}" "$SKY/done/skyward-{skyward_key}"\n'
                  f'"$UV" venv --quiet --python "$(cat "$SKY/envs/{ek}.python")" "$ENV"', ek, venv_check)
    source = ' --no-index --find-links "$SKY/wheels"' if plan.install == "wheelhouse" else ""
    # With a lock, a new environment gets its packages and skyward's wheel in one uv run (each run
    # is 0.1 s of a fresh node's start): the wheel goes into the lock with its sha256, and the
    # skyward phase's marker is set; a new skyward on a warm node runs that phase alone.
    together = f'"$SKY/done/skyward-{skyward_key}"' if plan.skyward_sha256 else ""
    deps = _locked_deps(image, plan, together) if plan.lock else _deps(image, plan.install)
    if deps:
        phase("deps", deps, deps_key, venv_check)
    # The wheel's metadata pins the agent's dependencies to the client's versions.
    phase(
        "skyward",
        f'"$UV" pip install --quiet --python "$ENV/bin/python"{source} --reinstall-package skyward '
        f'"$SKY/{plan.skyward_wheel}"',
        skyward_key,
        venv_check,
    )
    out.append("env_unlock\n")
    if plan.includes_archive:
        phase("includes", 'rm -rf "$POOL/includes"\nmkdir -p "$POOL/includes"\n'
              'tar -xf "$POOL/includes.tar" -C "$POOL/includes"\nrm -f "$POOL/includes.tar"')
    if image.shell_vars:
        lines = [". \"$POOL/env.sh\""]
        for name, command in image.shell_vars.items():
            lines.append(f"_v=$(bash -c {q(command)})")
            lines.append(f"printf 'export %s=%q\\n' {q(name)} \"$_v\" >> \"$POOL/env.sh\"")
        phase("shell_vars", "\n".join(lines))
    if plan.volumes:  # every pool mounts its own (never skipped); before plugin ops, which may read them
        phase("volumes", plan.volumes)
    if plan.ops:
        body = ". \"$POOL/env.sh\"\nexport PATH=\"$ENV/bin:$PATH\"\n" + "\n".join(plan.ops)
        phase("plugins", body, key(ek, list(plan.ops)), node_local=True)
    if image.apt:  # the versions apt installed, for the pool's record (every run: a phase may skip)
        names = " ".join(q(p.split("=", 1)[0]) for p in image.apt)
        out.append(f"dpkg-query -W -f '{MARKER} apt ${{Package}} ${{Version}}\\n' {names} 2>/dev/null || true\n")
    out.append(f"printf '%s{MARKER} ready\\n' \"$_sky_held\"; _sky_held=''\n")
    return "".join(out)


# The node's folders, as the client and the script compute them (bash). SKY: caches, in the
# login user's home (maybe shared by many hosts). RUN: this node's runtime state, on node-local
# disk (see run_folder).
# ``uid``: how the shell gets the user's id (``$EUID`` in bash, where node_up runs: no `id` process).
# A folder that exists is not made again (no `mkdir` process: a warm host's start runs few).
def _node_dirs(uid: str) -> str:
    return (
        'SKY="${SKYWARD_NODE_HOME:-$HOME/.skyward}"\n'
        '[ -d "$SKY" ] || mkdir -p -m 700 "$SKY" 2>/dev/null\n'
        + run_folder(uid)
    )


def run_folder(uid: str) -> str:
    """POSIX shell that sets RUN (SKY set): ``/var/tmp/skyward-<uid>`` (or ``SKYWARD_NODE_RUN``)
    when it is a folder of this user's, not a link. One that is not (another user of the node
    made it first, to move the node's folder; or /var/tmp refuses us) is never used: a private
    folder of our own is made beside it as ``mktemp -d`` makes them (a new name, mode 0700) and
    found again through a note per host in SKY (which another user cannot write), so RUN stays
    on node-local disk with a short path; only where /var/tmp takes no folder at all is RUN one
    keyed by the host's name inside SKY."""
    ours = '[ -d "$RUN" ] && [ ! -L "$RUN" ] && [ -O "$RUN" ] && [ -w "$RUN" ]'
    return (
        f'RUN="${{SKYWARD_NODE_RUN:-/var/tmp/skyward-{uid}}}"\n'
        f'if ! {{ {{ [ -d "$RUN" ] || mkdir -p -m 700 "$RUN" 2>/dev/null; }} && {ours}; }}; then\n'
        '  NOTE="$SKY/run/$(hostname).run"\n'
        '  RUN=$(cat "$NOTE" 2>/dev/null)\n'
        f'  if ! {{ [ -n "$RUN" ] && {ours}; }}; then\n'
        '    mkdir -p -m 700 "$SKY/run"\n'
        f'    if RUN=$(mktemp -d "/var/tmp/skyward-{uid}.XXXXXXXX" 2>/dev/null) && [ -n "$RUN" ]; then\n'
        '      printf \'%s\\n\' "$RUN" > "$NOTE.$$" && mv -f "$NOTE.$$" "$NOTE"\n'
        '    else\n'
        '      RUN="$SKY/run/$(hostname)"\n'
        '      mkdir -p -m 700 "$RUN"\n'
        '    fi\n'
        '  fi\n'
        'fi\n'
    )


NODE_DIRS = _node_dirs("$(id -u)")  # (any POSIX login shell: Slurm's login node runs it as is)

# Bash (4.1 or later) that makes a node's pool folder ($POOL) and holds its owner lock
# (bootstrap/sweep.py) before anything else is written there: a shared flock on an open file
# this shell keeps (SKYWARD_LOCK_FD), which the bootstrap's commands and the agent inherit, so the
# lock lives while any of them does and goes with the last (however it ends); another pool's
# agent then sweeps the folder. A new lock file is locked under another name first and then
# renamed, so no sweep ever finds it unheld. Without the flock command no lock file is made,
# and the folder is never swept. With ``kept`` (a named pool's) the folder is marked never to
# be swept at all (``skyward down`` removes it).
def hold_pool(kept: bool = False) -> str:
    return (
        '[ -d "$POOL" ] || mkdir -p -m 700 "$POOL"\n'
        'if command -v flock >/dev/null 2>&1; then\n'
        '  if [ -e "$POOL/.owner.lock" ]; then\n'
        '    exec {SKYWARD_LOCK_FD}<"$POOL/.owner.lock" && flock -s -n "$SKYWARD_LOCK_FD"\n'
        '  elif exec {SKYWARD_LOCK_FD}>"$POOL/.owner.lock.$$" && flock -s "$SKYWARD_LOCK_FD"; then\n'
        '    mv -f "$POOL/.owner.lock.$$" "$POOL/.owner.lock"\n'
        '  fi\n'
        'fi\n'
        + (': > "$POOL/.kept"\n' if kept else '')
    )


def node_dirs_command(pool_id: str, node: int, *, sudo: bool | Iterable[str]) -> str:
    """Bash that resolves a node's folders and prints them as ``@@KEY VALUE`` lines: sky, run, pool,
    uid, and with ``sudo`` (the Image's apt packages), whether a user who is not root may run the
    apt-get install of those packages through ``sudo -n``."""
    return (NODE_DIRS + f'echo "@@sky $SKY"\necho "@@run $RUN"\n'
            f'echo "@@pool $RUN/pools/{pool_folder(pool_id, node)}"\necho "@@uid $(id -u)"\n' + _sudo_check(sudo))


def _sudo_check(sudo: bool | Iterable[str], refused: str = "", uid: str = "$(id -u)") -> str:
    """``@@sudo ok`` or ``@@sudo WHY`` (then ``refused``, bash) for a login that is not root."""
    if not sudo:
        return ""
    packages = () if isinstance(sudo, bool) else tuple(sudo)
    # `sudo -n -l COMMAND` asks sudo's rules about exactly what the apt phase runs (`sudo -n
    # true` would refuse a rule narrowed to these packages, and to apt-get, alike).
    asked = f"sudo -n -l {_words(apt_install(packages))}" if packages else "sudo -n true"
    return (f'if [ "{uid}" -ne 0 ]; then\n'
            f'  if out=$({asked} 2>&1 </dev/null); then echo "@@sudo ok"; else echo "@@sudo ${{out:-refused}}"; {refused}fi\n'
            'fi\n')


# A file a node is sent: a path under SKY or the pool's folder, nothing that could climb out.
_SHIPPED_NAME = re.compile(r"[A-Za-z0-9_.+-]+(?:/[A-Za-z0-9_.+-]+)*")


def node_up(pool_id: str, node: int, *, sudo: bool | Iterable[str], files: dict[str, int], script: str,
            then: str, lz4_or_gz: tuple[str, str] | None = None, kept: bool = False) -> str:
    """The whole start of a node over SSH as one bash text, sent first on the command's stdin
    (``bash_on_stdin``): one command, and on a node that has everything no wait for the client
    within it. It resolves the node's folders as
    ``node_dirs_command`` does (``SKYWARD_KEEP_POOL`` in its environment keeps a node's folder),
    makes the pool's folder and holds its owner lock first (``hold_pool``; ``kept``: a named
    pool's, never swept) and prints them; stops after ``@@sudo WHY`` when sudo refuses the Image's apt packages; prints
    ``@@need PATH...``: which of ``files`` (path under SKY -> size) are missing or of another size.
    Then it reads what the client sent with the script, without waiting for anything: a line holding
    the pool's secret (kept in a shell variable, not exported: ``then`` hands it to the agent), a
    line ``MINE`` with a size and that many bytes of a tar archive, the pool's own files (into this
    node's folder). Only when it needs files does it wait for the client's answer to ``@@need``: a
    line ``SHARED`` and that many bytes of a tar archive unpacked into SKY. (Each file is renamed
    into place: other hosts of a shared home may be reading it.) Then ``@@received``, the rendered
    bootstrap ``script`` with those folders, and ``then`` (bash, e.g. the agent's start).

    ``lz4_or_gz``: two of ``files``, the same file packed two ways (uv's): a node with the lz4
    command needs only the first, any other only the second.

    Everything is inside one function, so bash has read all of this text before anything reads
    from the same stdin."""
    for name in files:
        if not _SHIPPED_NAME.fullmatch(name) or ".." in name.split("/"):
            raise ValueError(f"shipped file {name!r}: letters, digits, '_', '.', '+', '-' and '/' only")
    expected = " ".join(shlex.quote(f"{size}:{name}") for name, size in files.items())
    names = " ".join(shlex.quote(name) for name in files)
    return (
        "skyward_node_up() {\n"
        + _node_dirs("$EUID")
        + f'POOL="${{SKYWARD_KEEP_POOL:-$RUN/pools/{pool_folder(pool_id, node)}}}"\n'
        + hold_pool(kept)
        + 'echo "@@sky $SKY"; echo "@@run $RUN"; echo "@@pool $POOL"; echo "@@uid $EUID"\n'
        + _sudo_check(sudo, refused="return 0; ", uid="$EUID")
        + ((f"local skip={shlex.quote(' ' + lz4_or_gz[1] + ' ')}\n"
            f"command -v lz4 >/dev/null 2>&1 || skip={shlex.quote(' ' + lz4_or_gz[0] + ' ')}\n"
            if lz4_or_gz is not None else "local skip=''\n") if files else "")
        + (f"local -A have=()\nlocal size name need=''\n"
           f"while read -r size name; do have[$name]=$size; done < <(cd \"$SKY\" 2>/dev/null && "
           f"stat -c '%s %n' -- {names} 2>/dev/null </dev/null)\n"
           f"for size in {expected}; do\n"
           '  name=${size#*:}; size=${size%%:*}\n'
           '  case "$skip" in *" $name "*) continue;; esac\n'
           '  [ "${have[$name]:-}" = "$size" ] || need="$need $name"\n'
           "done\n" if files else "local need=''\n")
        # Held (the prelude's _sky_held) when nothing is needed: the client answers only a need.
        + 'if [ -n "$need" ]; then echo "@@need$need"; else _sky_held="@@need"$\'\\n\'; fi\n'
        "unset SKYWARD_AGENT_TOKEN; local mine\n"
        'IFS= read -r SKYWARD_AGENT_TOKEN && IFS=" " read -r mine '
        '|| { echo "the client sent nothing after the script" >&2; return 2; }\n'
        'if [ "$mine" -gt 0 ]; then _skyward_receive "$mine" "$POOL" || return 3; fi\n'
        'if [ -n "$need" ]; then\n'
        '  local shared\n'
        '  IFS=" " read -r shared || { echo "the client sent nothing after @@need" >&2; return 2; }\n'
        '  if [ "$shared" -gt 0 ]; then _skyward_receive "$shared" "$SKY" || return 3; fi\n'
        'fi\n'
        '_sky_held="${_sky_held:-}@@received"$\'\\n\'\n'
        'export SKYWARD_SKY="$SKY" SKYWARD_RUN="$RUN" SKYWARD_POOL="$POOL"\n'
        + script.rstrip("\n") + "\n"
        + then.rstrip("\n") + "\n"
        "}\n"
        + _RECEIVE
        # On the same line: bash runs it before reading further (there is nothing more to read).
        # What is still held goes out when it returns early (a failed upload: its @@need).
        + 'skyward_node_up; rc=$?; printf "%s" "${_sky_held:-}"; exit $rc\n'
    )


def bash_on_stdin(text: str, env: str = "") -> str:
    """The command, for any login shell, that runs ``text`` (sent first on the command's stdin)
    with bash in a session of its own (``setsid -w``: the script's processes are one group to
    stop), the rest of stdin left to the script. ``env``: ``NAME=value`` words for ``env``.

    ``bash -s`` reads a script from a pipe one byte per read(), as it must not read past the
    script: 20,000 system calls for node_up's text, 7 ms of a host's CPU on every start. ``read -N``
    takes it in one read (bash >= 4.1) and ``eval`` runs it. ``-N`` counts characters: an ASCII
    text only, where they are bytes in any locale; any other text, and a bash without ``-N``
    (whose read refuses the option and leaves stdin as it was), get ``bash -s``."""
    start = f"exec {'env ' + env + ' ' if env else ''}setsid -w bash"
    if not text.isascii():
        return f"{start} -s"
    take = (f'IFS= read -r -N {len(text)} _skyward_script 2>/dev/null || '
            '{ [ -z "$_skyward_script" ] && exec bash -s; exit 2; }; eval "$_skyward_script"')
    return f"{start} -c {shlex.quote(take)}"


# _skyward_receive BYTES BASE: exactly BYTES bytes of stdin (head -c reads no further: what follows
# is the client's next part), a tar, unpacked into a private folder next to BASE, then each file
# renamed into place.
_RECEIVE = """\
_skyward_receive() (
  set -eo pipefail
  base=$2; mkdir -p "$base"; stage=$(mktemp -d "$base/.incoming.XXXXXX")
  trap 'rm -rf "$stage"' EXIT
  head -c "$1" | tar -x --no-same-owner -f - -C "$stage"
  cd "$stage"
  find . -mindepth 1 -type d -exec sh -c 'for d; do mkdir -p "$0/$d" || exit 1; done' "$base" {} +
  find . ! -type d -exec sh -c 'for f; do mv -f "$f" "$0/$f" || exit 1; done' "$base" {} +
)
"""


# -- apt through sudo: the commands the apt phase runs, the check above and the advice, one source
# Another pool (or program) starting on this host may hold dpkg's lock: wait for it.
APT_WAIT = ("-o", "DPkg::Lock::Timeout=300")


def apt_install(packages: Iterable[str]) -> tuple[str, ...]:
    return ("apt-get", "install", *APT_WAIT, "-y", "-q", "--no-install-recommends", *packages)


def apt_update() -> tuple[str, ...]:
    return ("apt-get", "update", *APT_WAIT, "-q")


def sudo_advice(user: str, packages: Iterable[str]) -> str:
    """The ways for ``user`` (not root, refused by sudo) to install ``packages``: the narrowest
    first, and what each grants said plainly."""
    def rule_words(argv: tuple[str, ...]) -> str:
        # sudoers: ',', ':', '=' and '\' in a command's arguments are escaped with '\'.
        return " ".join(["/usr/bin/apt-get", *(re.sub(r"([,:=\\])", r"\\\1", a) for a in argv[1:])])

    narrow = f"{user} ALL=(root) NOPASSWD: {rule_words(apt_install(packages))}, {rule_words(apt_update())}"
    return (
        f"Either (1) let {user} run exactly the commands this Image needs, with a sudoers rule (in "
        f"/etc/sudoers.d/skyward, edited with `visudo -f`): '{narrow}'. It allows installing these "
        f"packages from the host's configured apt sources and nothing else; a change to apt= needs a "
        f"new rule. Or (2) '{user} ALL=(root) NOPASSWD: /usr/bin/apt-get': simpler, but it amounts "
        f"to giving {user} root (apt-get runs any command as root through its -o options and installs "
        f"any local .deb), so use it only for a user you would make root anyway. Or (3) log in as a "
        f"user who may (root), or drop apt= from the Image and install those packages on the hosts "
        f"yourself."
    )


def _words(argv: Iterable[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


def pool_folder(pool_id: str, node: int) -> str:
    """The name of one node's folder of a pool: per node, so nodes that share a filesystem
    (loopback hosts, a shared /var/tmp) never share one."""
    return f"{pool_id}-{node}"


def _locked_deps(image: Image, plan: NodePlan, skyward_marker: str = "") -> str:
    """Install the pool's lock exactly: no resolution, hashes checked when the lock has them. With
    ``skyward_marker`` (the skyward phase's marker file), skyward's wheel too, by its path under
    SKY and its sha256 (the lock holds the wheel's dependencies, pinned), and the marker set; not
    where SKY holds a space (a requirements file's line splits there): the skyward phase runs."""
    base = '"$UV" pip install --quiet --python "$ENV/bin/python" --no-deps'
    lines = [ln for ln in plan.lock.splitlines() if ln.strip() and not ln.startswith(" ")]
    if lines and all(ln.endswith("\\") for ln in lines):
        base += " --require-hashes"
    wheel = after = ""
    if skyward_marker:
        base += " --reinstall-package skyward"
        wheel = (f'together=0; case "$SKY" in *[[:space:]]*) ;; *) together=1\n'
                 f"  printf '%s --hash=sha256:%s\\n' \"$SKY/{plan.skyward_wheel}\" {plan.skyward_sha256} "
                 f'>> "$POOL/lock.txt";; esac\n')
        after = f"\nif [ $together = 1 ]; then touch {skyward_marker}; fi"
    if plan.install == "wheelhouse":
        base += ' --no-index --find-links "$SKY/wheels"'
    elif image.pip_indexes:
        base = _with_indexes("UV_EXTRA_INDEX_URL", [ix.url for ix in image.pip_indexes]) + base
        base += " --index-strategy unsafe-best-match"
    return (f"cat > \"$POOL/lock.txt\" <<'SKYWARD_LOCK'\n{plan.lock}SKYWARD_LOCK\n{wheel}"
            f'{base} -r "$POOL/lock.txt"{after}')


def _with_indexes(variable: str, urls: list[str]) -> str:
    """A bash assignment prefix handing ``urls`` to the uv command after it by its environment,
    before the ones the node's own environment names (Image.env). Never as options: an index URL
    may hold user:token@, and every user of the node can read a process's argv; the script itself
    travels on ssh's stdin, and bash runs no process for an assignment."""
    return f'{variable}={shlex.quote(" ".join(urls))}"${{{variable}:+ ${variable}}}" '



def _deps(image: Image, install: Install) -> str:
    """uv pip install lines for Image.pip; packages routed to a PipIndex go in a call of their own."""
    if not image.pip:
        return ""
    base = '"$UV" pip install --quiet --python "$ENV/bin/python"'
    if install == "wheelhouse":
        return base + ' --no-index --find-links "$SKY/wheels" ' + _args(image.pip)
    lines = []
    scoped: set[str] = set()
    for ix in image.pip_indexes:
        reqs = [r for r in image.pip if _name(r) in {_canon(p) for p in ix.packages}]
        scoped.update(reqs)
        if reqs:
            # UV_INDEX (uv's --index) comes before the default index: these packages resolve from it first.
            lines.append(f"{_with_indexes('UV_INDEX', [ix.url])}{base} {_args(reqs)}")
    rest = [r for r in image.pip if r not in scoped]
    if rest:
        lines.append(f"{base} {_args(rest)}")
    return "\n".join(lines)


def _args(reqs: Iterable[str]) -> str:
    return " ".join(shlex.quote(r) for r in reqs)


def _canon(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(".", "-")


def _name(requirement: str) -> str:
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        return _canon(Requirement(requirement).name)
    except InvalidRequirement:
        return _canon(requirement)


def parse_marker(line: str) -> tuple[str, str, int | None] | None:
    """('phase name', 'started'|'done'|'skipped'|'failed', exit code) for a marker line."""
    parts = line.split()
    if len(parts) < 4 or parts[0] != MARKER or parts[1] != "phase":
        return None
    code = int(parts[4]) if len(parts) > 4 and parts[4].lstrip("-").isdigit() else None
    return parts[2], parts[3], code


_PRELUDE = """\
#!/usr/bin/env bash
# Rendered by skyward: prepares this node for pool {pool}.
set -uo pipefail
# The client resolved this node's folders (script.NODE_DIRS) and passes them in.
SKY="${{SKYWARD_SKY:-${{SKYWARD_NODE_HOME:-$HOME/.skyward}}}}"
RUN="${{SKYWARD_RUN:-${{SKYWARD_NODE_RUN:-/var/tmp/skyward-$(id -u)}}}}"
POOL="${{SKYWARD_POOL:-$RUN/pools/{pool}-0}}"
ENV="$SKY/"{env}
UV="$SKY/bin/uv"
# No bytecode compilation at install: Python writes .pyc lazily for the modules a node imports.
export UV_NO_PROGRESS=1 UV_PYTHON_DOWNLOADS=manual
mkdir -p "$SKY/done" "$SKY/envs" "$SKY/locks" "$RUN/done" "$POOL"
chmod 700 "$SKY" "$RUN" "$POOL"
# Lines that need not reach the client at once (this pid, a phase skipped or done; node_up's
# @@received) wait in _sky_held and go out with the next line that must (a phase starting or
# failing, a wait, ready): a warm node's progress in two writes, two SSH packets where each line
# was one (the client's CPU per packet is what a warm start of many nodes spends).
_sky_held="${{_sky_held:-}}@@skyward pid $$"$'\n'

# env_lock KEY / env_unlock: hold $SKY/locks/env-KEY while building a shared environment. flock
# holds across the hosts of an NFS home (Linux maps it to NFS byte-range locks); the lock goes
# with the process that held it, so a host that died mid-build does not block the others.
env_lock() {{
  exec 9>"$SKY/locks/env-$1"
  if command -v flock >/dev/null 2>&1; then
    if ! flock -n 9; then
      printf '%s@@skyward wait env\n' "$_sky_held"; _sky_held=""
      flock 9
    fi
  fi
}}
env_unlock() {{
  exec 9>&-
}}

# phase NAME KEY CHECK DIR: run _p_NAME unless a marker in DIR says it already ran with these
# inputs (and CHECK still holds); exit with its code when it fails.
phase() {{
  local marker="$4/$1-$2"
  if [ -n "$2" ] && [ -e "$marker" ] && eval "$3"; then
    _sky_held+="@@skyward phase $1 skipped"$'\n'
    return 0
  fi
  printf '%s@@skyward phase %s started\n' "$_sky_held" "$1"; _sky_held=""
  ( set -e; "_p_$1" ) </dev/null 2>&1
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    printf '%s@@skyward phase %s failed %s\n' "$_sky_held" "$1" "$rc"; _sky_held=""
    exit "$rc"
  fi
  if [ -n "$2" ]; then touch "$marker"; fi
  _sky_held+="@@skyward phase $1 done"$'\n'
}}

"""

_APT = """\
export DEBIAN_FRONTEND=noninteractive
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo -n"; fi
# Try with the package lists the machine has; refresh them only when that fails.
if ! $SUDO {install}; then
  $SUDO {update} || echo "apt-get update failed; trying the install anyway"
  $SUDO {install}
fi"""

# Index mode, a node without uv: its wheel from the node's package index (PEP 503 simple API:
# SKYWARD_UV_INDEX, UV_INDEX_URL or PIP_INDEX_URL from Image.env, else PyPI), checksum
# verified, binary unpacked. Standard library only.
_FETCH_UV = """\
import base64, hashlib, html, io, os, platform, re, sys, urllib.parse, urllib.request, zipfile
dest, version = sys.argv[1], sys.argv[2]
index = (os.environ.get("SKYWARD_UV_INDEX") or os.environ.get("UV_INDEX_URL")
         or os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple").rstrip("/") + "/uv/"
# An index URL's user:token@ becomes a basic-auth header for that host only (urllib would not use
# it), and is never printed: what this says ends up in the pool's events and errors.
parts, auth = urllib.parse.urlsplit(index), {}
if parts.username is not None:
    who = urllib.parse.unquote(parts.username) + ":" + urllib.parse.unquote(parts.password or "")
    auth = {"Authorization": "Basic " + base64.b64encode(who.encode()).decode()}
    host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else (parts.hostname or "")
    index = urllib.parse.urlunsplit(parts._replace(netloc=host + (f":{parts.port}" if parts.port else "")))
def get(url, timeout):
    same = urllib.parse.urlsplit(url).netloc == urllib.parse.urlsplit(index).netloc
    return urllib.request.urlopen(urllib.request.Request(url, headers=auth if same else {}), timeout=timeout)
arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower(), platform.machine().lower())
try:
    page = get(index, 30).read().decode()
except OSError as exc:
    sys.exit(f"cannot fetch uv: {index} is not reachable from this node ({exc}); give the nodes an "
             f"index in Image(env={{'UV_INDEX_URL': ...}}) or use install='wheelhouse'")
for href in re.findall(r'href="([^"]+)"', page):
    url = urllib.parse.urljoin(index, html.unescape(href))
    name = url.split("#")[0].rsplit("/", 1)[-1]
    if name.startswith(f"uv-{version}-py3-none-manylinux") and name.endswith(f"_{arch}.whl"):
        break
else:
    sys.exit(f"no uv {version} wheel for {arch} at {index}")
data = get(url.split("#")[0], 300).read()
fragment = url.partition("#")[2]
if fragment.startswith("sha256=") and hashlib.sha256(data).hexdigest() != fragment[7:]:
    sys.exit(f"checksum mismatch for {name} from {index}")
with zipfile.ZipFile(io.BytesIO(data)) as wheel:
    binary = wheel.read(next(n for n in wheel.namelist() if n.endswith(".data/scripts/uv")))
os.makedirs(dest, exist_ok=True)
tmp = os.path.join(dest, "uv.tmp")
with open(tmp, "wb") as f:
    f.write(binary)
os.chmod(tmp, 0o755)
os.replace(tmp, os.path.join(dest, "uv"))
print(f"fetched uv {version} from {index}")
"""
