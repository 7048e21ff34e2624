"""The same program on machines you have, over SSH — or on this machine when none are given.

    python examples/ssh_hosts.py                               # sky.Local(): 2 processes here
    SKYWARD_HOSTS="me@10.0.0.5 me@10.0.0.6" python examples/ssh_hosts.py
    SKYWARD_HOSTS="gpu-a gpu-b" SKYWARD_KEY=~/.ssh/id_ed25519 python examples/ssh_hosts.py

Each host needs sshd, bash and a Python of this interpreter's major.minor; nothing else. The
first run on a host installs everything (the phases are printed as they go); the next run
finds them done and starts in about a second. Names from ~/.ssh/config work as hosts.
"""

from __future__ import annotations

import os
import socket

import skyward as sky


@sky.function
def where() -> str:
    info = sky.instance_info()
    return f"node {info.node} of {info.total_nodes}: {socket.gethostname()} ({info.peers[info.node].private_ip})"


@sky.function
def head_reachable() -> str:
    """What torch/jax rendezvous rely on: every node reaches the head's private address."""
    info = sky.instance_info()
    return f"node {info.node} sees the head at {info.head_addr}:{info.head_port}"


@sky.function
def word_lengths(words: list[str]) -> dict[str, int]:
    return {w: len(w) for w in words}


def main() -> None:
    hosts = os.environ.get("SKYWARD_HOSTS", "").split()
    if hosts:
        provider: object = sky.SSH(hosts=hosts, key=os.environ.get("SKYWARD_KEY"))
        nodes = len(hosts)
    else:
        provider, nodes = sky.Local(), 2
    with sky.Compute(provider=provider, nodes=nodes) as pool:
        for line in where() @ pool:
            print(line)
        for line in head_reachable() @ pool:
            print(line)
        text = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog"]
        chunks = [text[i::nodes] for i in range(nodes)]
        merged: dict[str, int] = {}
        for part in pool.map(word_lengths, chunks):
            merged.update(part)
        print(f"{len(merged)} distinct words, longest: {max(merged, key=merged.__getitem__)}")


if __name__ == "__main__":
    main()
