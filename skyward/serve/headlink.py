"""The endpoint's hold on a router that runs on the pool's head node (``on="head"``).

``HeadRouter`` starts skyward.serve.head's task on rank 0 and answers what the endpoint asks of
a router (``add_tcp``, ``remove``, ``wait_drained``, ``stats``, ``close``) through the head's
control socket, reached the way the pool reaches a node's socket (``Cluster.open_stream``). The
task's beats carry the router's counts (``stats`` is the last) and its access records, which go
to the endpoint's access log here.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..errors import ServeError
from . import head as head_task
from .router import BUCKETS, AccessRecord, RouterStats

if TYPE_CHECKING:
    from ..core.pool import Pool

log = logging.getLogger("skyward.serve")

_EMPTY = RouterStats(in_flight=0, queued=0, total=0, by_status={},
                     latency_buckets=(*((b, 0) for b in BUCKETS), (float("inf"), 0)), latency_sum=0.0,
                     cold_waits=0, per_replica={}, replicas=())


class HeadRouter:
    def __init__(self, pool: Pool, *, port: int, token: str | None, timeout: float, max_queue: int,
                 access_log: Callable[[AccessRecord], None]) -> None:
        from ..core.function import PendingFunction
        from ..core.membership import NodeState

        heads = [m for m in pool.members.records() if m.rank == 0 and m.state is NodeState.READY]
        if not heads:
            raise ServeError("pool.serve(on='head'): the pool has no ready head node (rank 0) to run the "
                             "endpoint's router on (is it asleep or still starting?). Wait for the pool, "
                             "or serve with on='client'.")
        self.address = heads[0].endpoint.private_ip
        self.node = heads[0].endpoint.index  # the provider's index of the head (a firewall's rule names it)
        self._access_log = access_log
        pending = PendingFunction(head_task.run, (), dict(host=self.address, port=port, token=token,
                                                           timeout=timeout, max_queue=max_queue))
        self._stream: Iterator[dict[str, Any]] = pool.dispatcher.run_async(pending, target=0).result()
        first = next(self._stream)
        self.host, self.port = str(first["host"]), int(first["port"])
        self._control = pool.cluster.open_stream(heads[0].endpoint.index, first["control"])
        self._lock = threading.Lock()
        self._buffer = b""
        self._stats = _EMPTY
        self._closed = False
        self._thread = threading.Thread(target=self._follow, name="skyward-serve-head", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        try:
            for beat in self._stream:
                self._stats = beat.get("stats", self._stats)
                for record in beat.get("access", ()):
                    self._access_log(record)
        except BaseException as e:
            if not self._closed:
                log.error("the endpoint's router on the head node ended: %s", e)
        else:
            if not self._closed:
                log.error("the endpoint's router on the head node ended")

    def _call(self, command: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self._control.sendall(json.dumps(command).encode() + b"\n")
            while b"\n" not in self._buffer:
                data = self._control.recv(1 << 16)
                if not data:
                    raise ServeError("the endpoint's router on the head node closed its control socket "
                                     "(the head node was lost?)")
                self._buffer += data
            line, _, self._buffer = self._buffer.partition(b"\n")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise ServeError(f"the endpoint's router on the head node: {answer['error']}")
        return answer

    def add_tcp(self, key: str, host: str, port: int, max_concurrency: int) -> None:
        self._call({"add": key, "host": host, "port": port, "max_concurrency": max_concurrency})

    def remove(self, key: str, *, lost: bool) -> None:
        if self._closed:
            return  # (the router went with its replicas)
        try:
            self._call({"remove": key, "lost": lost})
        except (OSError, ServeError) as e:
            log.warning("replica %s: telling the head node's router it left failed: %s", key, e)

    def wait_drained(self, key: str, timeout: float) -> bool:
        return bool(self._call({"drained": key, "timeout": timeout})["ok"])

    def stats(self) -> RouterStats:
        return self._stats

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._control.close()
        except OSError:
            pass
        self._stream.close()  # type: ignore[attr-defined]  # (a StreamReader: STOP, once)
        self._thread.join(15)
