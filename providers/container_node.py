"""What runs inside a sky.Container node, as shell text the provider hands to the runtime.

A node is one container. Its main process (``WATCH``) only waits: for the agent to start (at
most until the bootstrap's deadline), then for the agent to exit, and then ends, which stops
the container; ``--rm`` removes it. The agent exits when the pool closes, and by itself when no
client renewed its lease for ``ttl`` seconds, so a client that crashed leaves no container behind.

Two folders of the host are mounted into every node:

* ``/opt/skyward`` (``SKYWARD_NODE_HOME``): skyward's caches, shared by every node of every pool
  of the same image (the uv binary, the wheelhouse, the virtualenv, built once under the
  bootstrap's lock and then skipped, as on hosts that share an NFS home);
* ``/run/skyward`` (``SKYWARD_NODE_RUN``): this node's own folder, 0700 on the host: its phase
  markers, its folder of the pool (``env.sh``, ``includes``, the agent's log) and the agent's
  Unix socket, which the client connects to from the host. No port is published: only the user
  who runs the pool (and root) can open that folder.
"""

from __future__ import annotations

import shlex

NODE_HOME = "/opt/skyward"
NODE_RUN = "/run/skyward"
AGENT_SOCKET = f"{NODE_RUN}/agent.sock"
AGENT_PID = f"{NODE_RUN}/agent.pid"


def watch(deadline: int) -> str:
    """The container's main process (POSIX sh: images without bash still start and say so)."""
    return (
        f"n=0; while [ ! -s {AGENT_PID} ]; do n=$((n+1)); "
        f"if [ $n -gt {int(deadline)} ]; then echo 'no agent started within {int(deadline)} s' >&2; exit 3; fi; "
        f"sleep 1; done; "
        f'while kill -0 "$(cat {AGENT_PID} 2>/dev/null)" 2>/dev/null; do sleep 1; done'
    )


def start_agent(pool_dir: str, agent_python: str, ttl: float, timeout: int) -> str:
    """Bash that starts the agent detached (the token is read from stdin, never on argv), waits for
    its handshake line and prints it, the node's interface and its hostname as ``@@key`` lines."""
    sky, pool = shlex.quote(NODE_HOME), shlex.quote(pool_dir)
    return f"""set -e
SKY={sky}; POOL={pool}
IFS= read -r SKYWARD_AGENT_TOKEN; export SKYWARD_AGENT_TOKEN
cd "$POOL"; . ./env.sh
mkdir -p site
PP="$POOL/site"; if [ -d "$POOL/includes" ]; then PP="$POOL/includes:$PP"; fi
export PYTHONPATH="$PP${{PYTHONPATH:+:$PYTHONPATH}}" SKYWARD_SITE="$POOL/site" SKYWARD_UV="$SKY/bin/uv"
rm -f agent.json {AGENT_PID}
setsid "$SKY/{agent_python}" -m skyward.bootstrap.agent_start --ttl {ttl:g} --log agent.log \\
  --socket {AGENT_SOCKET} --orphan-cleanup "$POOL" --orphan-cleanup {NODE_RUN} </dev/null >agent.json 2>>agent.log &
for _ in $(seq 1 {timeout * 20}); do [ -s agent.json ] && break; sleep 0.05; done
echo "@@hello $(head -n1 agent.json)"
sed -n 's/.*"pid": *\\([0-9][0-9]*\\).*/\\1/p' agent.json > {AGENT_PID}
echo "@@hostname $(hostname)"
for dev in /sys/class/net/*; do [ "${{dev##*/}}" = lo ] || {{ echo "@@interface ${{dev##*/}}"; break; }}; done
"""
