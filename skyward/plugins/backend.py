"""The "skyward" joblib backend: joblib batches become pool tasks.

One backend class serves two places:

* **on the client**, inside a pool's ``with`` block (or given ``pool=``): each batch is sent
  to the node with the fewest tasks in flight, like any task;
* **on a node**, inside a running task: the batch travels up the node's own connection to
  the client (``Kind.SUBMIT``), which forwards it, unopened, to a node of the pool and sends
  the result back down (``Kind.REPLY``). The client is the hub: no port or address between
  nodes is needed. While a task waits for its nested batches, its agent lends its slot to
  them, so a pool whose every slot runs a ``GridSearchCV`` cannot deadlock.

``effective_n_jobs(-1)`` is the pool's total slot count (nodes x (concurrency + buffer)).
Batches are sized automatically (joblib's AutoBatchingMixin) so that tiny calls share round
trips. Nested ``Parallel`` calls inside a batch run sequentially where the batch runs.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FuturesTimeout
from typing import Any

# From joblib's modules, not the package: skyward.joblib_name registers this backend while
# the package is still importing (right after joblib.parallel has loaded).
from joblib._parallel_backends import AutoBatchingMixin, ParallelBackendBase, SequentialBackend
from joblib.parallel import register_parallel_backend

from skyward.bootstrap import serialize
from skyward.bootstrap.frames import Frame, Kind
from skyward.errors import (
    NoActivePoolError,
    NodeLostError,
    SerializationError,
    TaskCancelledError,
)
from skyward.runtime import context

NAME = "skyward"
log = logging.getLogger("skyward")
# How long an aborted call waits for its cancelled batches to answer. A node answers within
# a fraction of a second (a stuck thread's slot is replaced after 0.1 s); this bound is for a
# node that stopped answering at all, which membership then reports as lost.
_ABORT_WAIT = 30.0
# Warning categories that every node can import by name; filters naming anything else (a
# category from pytest, or from a module only this machine has) are left out of what joblib
# and scikit-learn pickle along with each batch, or the node could not unpickle it.
_PORTABLE = ("builtins", "warnings", "sklearn", "joblib", "numpy", "scipy", "pandas")
_filters_lock = threading.RLock()


@contextlib.contextmanager
def portable_warning_filters() -> Iterator[None]:
    """For the time of a pickling, drop warning filters whose category nodes may not import.

    scikit-learn ships ``warnings.filters`` itself (the list object) with every batch. The
    list is trimmed in place and restored on the way out, so the caller's filters are the
    same afterwards (the same list, the same entries, in order).
    """
    filters: list[Any] = warnings.filters  # type: ignore[assignment]
    with _filters_lock:
        saved = list(filters)
        keep = [f for f in saved if _portable(f)]
        if len(keep) == len(saved):
            yield
            return
        filters[:] = keep
        try:
            yield
        finally:
            filters[:] = saved
            warnings._filters_mutated()  # type: ignore[attr-defined]


def _portable(entry: tuple[Any, ...]) -> bool:
    category = entry[2] if len(entry) > 2 else None
    if category is None:
        return True
    module = getattr(category, "__module__", "") or ""
    return module.split(".")[0] in _PORTABLE or module == "__main__"


def decode(result: Frame | BaseException, name: str) -> Any:
    """A RESULT (or REPLY) frame -> the value, or raise the task's exception."""
    from skyward.core.dispatch import decode_result

    return decode_result(result, f"a joblib batch ({name})")


class _Batch:
    __slots__ = ("cancelled", "done", "payload", "sent")

    def __init__(self, payload: tuple[int, Any, Any], done: Callable[[Frame | BaseException], None]) -> None:
        self.payload, self.done = payload, done
        self.sent: tuple[Any, int] | None = None  # (channel, task id) once on a node
        self.cancelled = False


class _ClientTarget:
    """Sends batches straight to the pool's nodes, through its dispatcher (skyward.core.dispatch).

    A batch goes to a node with a free slot. While every slot is taken, batches wait here, not
    in one node's queue: joblib sends 2 x n_jobs batches ahead, and a batch queued behind a
    slow one on its node would wait for it while other nodes idle (an unordered generator's
    fast results, a failing fit found late). The first node to free a slot takes the next."""

    def __init__(self, pool: Any, group: str | None = None) -> None:
        """``group``: the pool's group whose nodes take the batches (skyward.core.group), else
        the head group's (a pool of one group: its nodes)."""
        self.pool = pool
        self.dispatcher = pool.dispatcher if group is None else pool[group].group.dispatcher
        self._lock = threading.Lock()
        self._waiting: collections.deque[_Batch] = collections.deque()
        self._out = 0  # our batches on the nodes

    def slots(self) -> int:
        return max(1, len(self.dispatcher.members.ready())) * self.pool.worker.slots

    def submit(self, payload: tuple[int, Any, Any], done: Callable[[Frame | BaseException], None]) -> Callable[[], None]:
        self.dispatcher.check_open()
        batch = _Batch(payload, done)
        with self._lock:
            self._waiting.append(batch)
        self._pump()
        return lambda: self._cancel(batch)

    def _free_node(self) -> Any:
        per = self.pool.worker.slots
        free = [c for c in self.dispatcher.members.ready() if c.inflight < per]
        if free:
            return min(free, key=lambda c: c.inflight)
        # Every slot runs something; with none of ours among them, nothing of ours would call
        # _pump again: queue on the least busy node instead.
        return None if self._out else self.dispatcher.least_busy()

    def _pump(self) -> None:
        while True:
            with self._lock:
                if not self._waiting:
                    return
                ch = self._free_node()
                if ch is None and self._out:
                    return  # one of ours comes back and pumps again
                batch = self._waiting.popleft()
                self._out += ch is not None
            flags, body, buffers = batch.payload
            if ch is None:
                serialize.discard(buffers)
                batch.done(NodeLostError("every node of the pool was lost; no node is left to run joblib batches."))
                continue

            def finished(result: Frame | BaseException, batch: _Batch = batch) -> None:
                with self._lock:
                    self._out -= 1
                batch.done(result)
                self._pump()

            try:
                tid = ch.submit(Kind.TASK, flags, body, buffers, finished)
            except NodeLostError as exc:  # lost between the pick and the send
                finished(exc)
                continue
            with self._lock:
                batch.sent = (ch, tid)
                cancel = batch.cancelled
            if cancel:  # cancelled while it was being sent
                ch.cancel(tid)

    def _cancel(self, batch: _Batch) -> None:
        with self._lock:
            batch.cancelled = True
            waiting = batch.sent is None and batch in self._waiting
            if waiting:
                self._waiting.remove(batch)
            sent = batch.sent
        if waiting:
            serialize.discard(batch.payload[2])
            batch.done(TaskCancelledError("the joblib batch was cancelled before it was sent (the call was aborted)"))
        elif sent is not None:
            sent[0].cancel(sent[1])

    @property
    def spill(self) -> Any:
        return self.dispatcher.members.cluster.spill_dir


# A Parallel(backend="skyward") in a process that another one started for its work: a worker of
# joblib's loky backend (or of multiprocessing) is a fresh interpreter, which holds no pool. It
# knows the name even where nothing it runs imports skyward: skyward-joblib.pth, installed in
# site-packages, registers it when joblib.parallel is first imported (skyward/joblib_pth.py;
# with SKYWARD_NO_JOBLIB_HOOK=1, joblib's own "Invalid backend: skyward" there).
_IN_A_WORKER = (
    "Parallel(backend=\"skyward\") ran in {worker}, a process another one started for its work (a "
    "worker of joblib's loky or multiprocessing backend, say), with no skyward pool in it: a pool "
    "is used from the process that opened it (any of its threads) and from tasks on its nodes. "
    "Make skyward the outer backend instead (a Parallel inside its tasks runs on the pool too); "
    "or, in this process, open a pool or attach to a named one (`skyward up NAME`): `import "
    "skyward as sky`, then `with sky.Compute(name=NAME):` around the Parallel call."
)


def _started_for_work() -> str | None:
    """This process's name and id when another process started it (multiprocessing's or
    loky's worker processes), else None."""
    import multiprocessing
    import os

    if multiprocessing.parent_process() is None:
        return None
    return f"process {multiprocessing.current_process().name} (pid {os.getpid()})"


class _NodeTarget:
    """Sends batches up this node's connection to the client, which runs them on the pool."""

    def __init__(self) -> None:
        hub = context.hub
        if hub is None:
            from skyward.core.target import none_active

            worker = _started_for_work()
            if worker is not None:
                raise NoActivePoolError(_IN_A_WORKER.format(worker=worker))
            raise NoActivePoolError(
                f"the skyward joblib backend runs on a pool: the one whose `with` block this "
                f"thread (or, from a thread of your own, the one pool open) is in, or the one a "
                f"task runs on; {none_active()}. Open the pool around the Parallel call (with "
                f"plugins=[sky.plugins.joblib()] it is joblib's default backend there), or name "
                f"it: `with joblib.parallel_config(backend=\"skyward\", pool=pool):`, or "
                f"Parallel(backend=sky.plugins.SkywardBackend(pool=pool))."
            )
        self.hub = hub
        # joblib submits follow-up batches from whichever thread completed one; they all
        # belong to the task running here, whose slot the agent lends while it waits.
        self.parent = context.current_task.get()

    def slots(self) -> int:
        topo = context.topology()
        return max(1, int(topo.get("total_nodes", 1)) * int(topo.get("slots_per_node", 1)))

    def submit(self, payload: tuple[int, Any, Any], done: Callable[[Frame | BaseException], None]) -> Callable[[], None]:
        flags, body, buffers = payload
        self.hub.submit_nested(Kind.TASK, flags, body, buffers, done, parent=self.parent)
        return lambda: None  # the batch is already with the client; its result is ignored

    @property
    def spill(self) -> Any:
        return self.hub.spill


class SkywardBackend(AutoBatchingMixin, ParallelBackendBase):
    """joblib backend running each batch as a task of a skyward pool (see module doc).

    ``pool``: the pool to use; by default the active one (the ``with`` block), or, inside a
    task on a node, the pool that task runs on.
    """

    supports_retrieve_callback = True
    supports_timeout = True
    supports_return_generator = True
    supports_sharedmem = False
    uses_threads = False
    default_n_jobs = -1

    def __init__(self, pool: Any = None, nesting_level: int | None = None,
                 inner_max_num_threads: int | None = None, group: str | None = None, **kwargs: Any) -> None:
        """``group``: in a pool of several groups, the one whose nodes run the batches
        (``parallel_config(backend="skyward", group="prep")``); the head group's by default."""
        super().__init__(nesting_level=nesting_level, inner_max_num_threads=inner_max_num_threads, **kwargs)
        self._pool = pool
        self._group = group
        self._target: _ClientTarget | _NodeTarget | None = None
        # The batches sent and not answered yet: how to cancel each, and its future.
        self._out: dict[int, tuple[Callable[[], None], Future[Any]]] = {}
        self._ids = 0
        self._lock = threading.Lock()

    def _resolve(self) -> _ClientTarget | _NodeTarget:
        if self._pool is not None:
            return _ClientTarget(self._pool, self._group)
        from skyward.core.target import active_pool

        pool = active_pool()
        if pool is not None:
            return _ClientTarget(pool, self._group)
        return _NodeTarget()

    def effective_n_jobs(self, n_jobs: int | None) -> int:
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning")
        total = (self._target or self._resolve()).slots()
        if n_jobs is None or n_jobs < 0:
            return max(total + 1 + (n_jobs or -1), 1)
        return n_jobs

    def configure(self, n_jobs: int = 1, parallel: Any = None, prefer: Any = None,
                  require: Any = None, **kwargs: Any) -> int:
        self.parallel = parallel
        self._target = self._resolve()
        return self.effective_n_jobs(n_jobs)

    def submit(self, func: Any, callback: Any = None) -> Future[Any]:
        """Send one batch. Never raises: joblib submits follow-up batches from the thread that
        completed one, inside a future's callback, where an exception would be swallowed and
        leave joblib waiting for a batch that was never sent. A batch that cannot be sent ends
        with its error instead, which joblib raises from the call like a task's."""
        future: Future[Any] = Future()
        future.set_running_or_notify_cancel()
        if callback is not None:
            future.add_done_callback(callback)
        try:
            self._send(func, future)
        except BaseException as exc:
            if not future.done():
                future.set_exception(exc)
        return future

    def _send(self, func: Any, future: Future[Any]) -> None:
        target = self._target or self._resolve()
        self._target = target
        name = getattr(func, "__qualname__", None) or type(func).__name__
        with portable_warning_filters():
            try:
                payload = serialize.dumps((func, (), {}, None), target.spill)
            except Exception as exc:
                raise SerializationError(
                    f"a joblib batch could not be pickled to reach the pool ({type(exc).__name__}: "
                    f"{exc}). Pass plain data to delayed(...) calls, or create such objects "
                    f"inside the function."
                ) from exc
        with self._lock:
            self._ids += 1
            key = self._ids

        def done(result: Frame | BaseException) -> None:
            with self._lock:
                self._out.pop(key, None)
            try:
                value = decode(result, name)
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(value)

        cancel = target.submit(payload, done)
        with self._lock:
            if not future.done():
                self._out[key] = (cancel, future)

    def retrieve_result_callback(self, out: Future[Any]) -> Any:
        return out.result()

    def abort_everything(self, ensure_ready: bool = True) -> None:
        """joblib gave up on the call (a timeout, a task's error, a generator dropped): every
        batch of it still out is cancelled (dropped where it waits for a slot, interrupted
        where it runs, its slot replaced if its thread does not stop), and this returns once
        they have all answered, so that the next call finds the slots free."""
        with self._lock:
            out = list(self._out.values())
        for cancel, _ in out:
            try:
                cancel()
            except Exception:
                pass
        end = time.monotonic() + _ABORT_WAIT
        for _, future in out:
            try:
                future.exception(timeout=max(0.0, end - time.monotonic()))
            except FuturesTimeout:
                log.warning("skyward joblib backend: %d cancelled batch(es) did not answer within %g s; "
                            "the next call may wait for their slots", sum(not f.done() for _, f in out),
                            _ABORT_WAIT)
                break
        self.reset_batch_stats()

    def terminate(self) -> None:
        self.reset_batch_stats()

    def get_nested_backend(self) -> tuple[ParallelBackendBase, int | None]:
        return SequentialBackend(nesting_level=(self.nesting_level or 0) + 1), None


_registered = False


def register() -> None:
    """Make ``"skyward"`` a joblib backend name (idempotent)."""
    global _registered
    if not _registered:
        register_parallel_backend(NAME, SkywardBackend)
        _registered = True


register()
