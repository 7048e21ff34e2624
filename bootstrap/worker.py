"""A worker process: runs its agent's tasks in a few threads.

The agent starts one worker process per node for the thread executor (``threads`` =
concurrency + buffer) and one per slot for the process executor (``exclusive``: on a timeout
the process exits and the agent replaces it, which is the only sure way to stop the task).
The worker talks to its agent over an inherited socket with the same frames as the client.

Plugins (``skyward.runtime.plugins``) arrive with CONFIGURE: their around_app hooks are
entered when the worker starts serving and exited when it stops; decorators wrap every
call. The worker is also its tasks' way up to the client (``context.hub``): a task may submit
work to the pool (the joblib backend does), which goes up this socket as a SUBMIT frame.
"""

from __future__ import annotations

import base64
import collections
import ctypes
import io
import itertools
import json
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from skyward.errors import SerializationError, TaskCancelledError, TaskTimeoutError
from skyward.runtime import context

from . import otel as _otel
from . import serialize
from .frames import FLAG_STREAM_OUT, NESTED, Frame, FrameReader, FrameWriter, Kind, tune
from .lane import LANE_BIT, LaneCount, WorkerLanes
from .procs import TERMINATED
from .procs import alive as _alive

STDOUT, STDERR = 1, 2
_GRACE = 1.0  # seconds a timed-out thread gets to unwind before it is given up on
# A cancelled task's caller waits for its slot (joblib's next call starts on it), so a thread
# that does not unwind this fast (blocked in C: a sleep, a native fit) is replaced sooner.
_CANCEL_GRACE = 0.1
_EARLY_STOPS = 1024  # STOPs kept for streams not registered yet (see Worker._stop_early)


class _Cancelled(BaseException):
    """Raised in a cancelled task's thread: not an Exception, so that the task's own
    ``except Exception`` does not swallow it."""


class _Entry:
    __slots__ = ("deadline", "gone", "ident", "lock", "name", "state", "task_id", "timeout")

    def __init__(self, task_id: int, ident: int) -> None:
        self.task_id = task_id
        self.ident = ident
        self.deadline: float | None = None
        self.timeout: float | None = None
        self.name = "task"
        # loading -> running -> returning -> done; or timed_out, or cancelled -> done | abandoned
        self.state = "loading"
        self.lock = threading.Lock()
        # Its thread was given up on (stuck after a timeout or a cancel) and a new slot took
        # its place: the thread ends when the task does (set and read with Worker.lock held).
        self.gone = False


class TaskStream(io.TextIOBase):
    """sys.stdout / sys.stderr on a node: routes text to the task that wrote it."""

    skyward_task_stream = True

    def __init__(self, worker: Worker, stream: int, fd: int) -> None:
        self._worker = worker
        self._stream = stream
        self._fd = fd
        self._pending: dict[int, str] = {}
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def isatty(self) -> bool:
        return False

    def write(self, s: str) -> int:
        if not s:
            return 0
        cb = context.redirect.get()
        if cb is not None:
            cb(self._stream, s)
            return len(s)
        if (context.suppress_stdout if self._stream == STDOUT else context.suppress_stderr).get():
            return len(s)
        tid = context.current_task.get()
        with self._lock:
            text = self._pending.pop(tid, "") + s
            cut = text.rfind("\n") + 1
            if cut < len(text):
                self._pending[tid] = text[cut:]
        if cut:
            self._worker.send_output(tid, self._stream, text[:cut])
        return len(s)

    def flush(self) -> None:
        self.flush_task(context.current_task.get())

    def flush_task(self, tid: int) -> None:
        with self._lock:
            text = self._pending.pop(tid, "")
        if text:
            self._worker.send_output(tid, self._stream, text)


class Worker:
    def __init__(self, sock: socket.socket, threads: int, exclusive: bool,
                 lane_listener: socket.socket | None = None, lane_count: LaneCount | None = None) -> None:
        self.sock = sock
        self.reader = FrameReader(sock)
        self.writer = FrameWriter(sock)
        self.threads = threads
        self.exclusive = exclusive
        self.read_lock = threading.Lock()
        self.running: dict[int, _Entry] = {}
        self.lock = threading.Lock()
        # Tasks read while every slot was busy (see _look_for_frames), for the next free slot.
        self._stash: collections.deque[tuple[Frame, _Entry]] = collections.deque()
        self._peeking = False
        self.streams = (TaskStream(self, STDOUT, 1), TaskStream(self, STDERR, 2))
        self.spill: Path | None = None  # shared memory for large results: the pool's (Local) or the node's
        self.plugins: Any = None  # skyward.runtime.plugins.NodePlugins when the pool has plugins
        self._exiting = threading.Lock()
        # Nested dispatch: our id -> callback for the REPLY; a reader thread while any is out.
        self._nested: dict[int, Callable[[Frame | BaseException], None]] = {}
        self._nested_ids = itertools.count(1)
        self._nested_reader = False
        # Streaming (stream.py): generator tasks sending values, iterator arguments arriving.
        self._streams: dict[int, Any] = {}  # task id -> stream.OutStream
        self._feeds: dict[tuple[int, int], Any] = {}  # (task id, argument) -> stream.FeedIterator
        # STOPs for generator tasks whose stream is not registered yet: read while the task
        # loads, or even before its TASK frame (the agent routes a task, then sends it, and a
        # STOP from another thread can pass in between). Applied at registration, dropped when
        # the task ends; bounded, since a STOP for a task that already ended lands here too.
        self._early_stops: dict[int, None] = {}
        # Clients on this host send tasks straight here (lane.py) once the agent says so.
        self._lane_listener, self._lane_count = lane_listener, lane_count
        self.lanes: WorkerLanes | None = None

    def configure(self, config: dict[str, Any]) -> None:
        context.configure(config["topology"])
        context.state = config.get("state")
        self.spill = Path(config["spill"]) if config.get("spill") else None
        # The client is on this host: nothing this process sends goes through lz4 (see serialize).
        serialize.COMPRESS = not config.get("local")
        listener, self._lane_listener = self._lane_listener, None
        if listener is not None:
            if config.get("lane") and not self.exclusive and self.lanes is None:
                self.lanes = WorkerLanes(listener, bytes.fromhex(str(config["lane"]["key"])), self._lane_count)
            else:
                listener.close()  # the agent keeps this worker's tasks to itself
        if config.get("plugins") and self.plugins is None:
            import cloudpickle

            from skyward.runtime.plugins import NodePlugins

            plugins = cloudpickle.loads(base64.b64decode(config["plugins"]))
            self.plugins = NodePlugins(plugins, process_executor=self.exclusive)

    def _info(self) -> Any:
        from skyward.runtime.info import instance_info

        return instance_info()

    def start_plugins(self) -> None:
        """Enter the around_app hooks now, before the first task (see runtime.plugins)."""
        if self.plugins is not None:
            self.plugins.enter_app(self._info())

    # -- plumbing ----------------------------------------------------------------------------
    def _writer_for(self, tid: int) -> tuple[FrameWriter, int] | None:
        """Where a task's frames go: the agent, or the lane it came by (None: that lane closed)."""
        if tid & LANE_BIT and self.lanes is not None:
            return self.lanes.writer_for(tid)
        return self.writer, tid

    def send_output(self, tid: int, stream: int, text: str) -> None:
        dest = self._writer_for(tid)
        if dest is None:
            return
        try:
            dest[0].send_parts(Kind.OUTPUT, dest[1], stream, text.encode("utf-8", "replace"))
        except OSError:
            pass

    def log(self, text: str) -> None:
        self.send_output(0, STDERR, text if text.endswith("\n") else text + "\n")

    def _send_result(self, tid: int, payload: tuple[int, Any, serialize.Buffers]) -> None:
        flags, body, buffers = payload
        if tid & LANE_BIT:
            dest = self._writer_for(tid)
            try:
                if dest is None:
                    raise OSError("the lane closed")
                dest[0].send_parts(Kind.RESULT, dest[1], flags, body, buffers)
            except OSError:
                serialize.discard(buffers)  # the client went away: nobody reads them
            return
        self.writer.send_parts(Kind.RESULT, tid, flags, body, buffers)

    # -- main loop ---------------------------------------------------------------------------
    def serve(self) -> None:
        sys.stdout, sys.stderr = self.streams
        threading.Thread(target=self._watchdog, name="skyward-watchdog", daemon=True).start()
        # The agent stops a busy worker with SIGTERM (its slots may all be inside tasks, so
        # nobody would read a SHUTDOWN frame); the main thread waits here to handle it.
        # Its status says it was a SIGTERM (143, as a shell would): when the agent did not send
        # it, someone stopping the whole node did (scancel, systemd), and the agent
        # tells that apart from a crash (agent.worker_exited).
        signal.signal(signal.SIGTERM, lambda *_: self.exit(TERMINATED))
        context.hub = self
        self.start_plugins()
        for _ in range(self.threads):
            self._start_slot()
        threading.Event().wait()  # the slots do the work; exit() ends the process

    def exit(self, status: int = 0) -> None:
        if not self._exiting.acquire(blocking=False):
            threading.Event().wait()  # another thread is already ending the process
        if self.plugins is not None:
            # Exit hooks (a torch barrier...) get a bounded time: the agent kills a worker
            # that has not exited 3 s after asking.
            t = threading.Thread(target=self.plugins.exit, name="skyward-plugin-exit", daemon=True)
            t.start()
            t.join(2.0)
        for s in self.streams:
            s.flush_task(0)
        os._exit(status)

    def _start_slot(self) -> None:
        threading.Thread(target=self._slot, name="skyward-slot", daemon=True).start()

    def _slot(self) -> None:
        # Leader/followers: an idle slot takes the socket and reads the next task itself, so
        # a task reaches the thread that runs it without a hand-off (one wake-up less per
        # call). Tasks are only sent to free slots, so a busy node has no unread task waiting.
        while True:
            with self.read_lock:
                with self.lock:
                    stashed = self._stash.popleft() if self._stash else None
                if stashed is not None:
                    frame, entry = stashed
                else:
                    frame = self._next_task()
                    entry = self._claim(frame)  # before the lock goes: a CANCEL read next finds it
            if self._run(frame, entry):
                return  # a replacement slot took this one's place while it was stuck

    def _read(self) -> Frame:
        """The next frame from the agent, or a task from a lane (call holding read_lock)."""
        if self.lanes is None:
            return self.reader.read()
        return self.lanes.next_frame(self.reader, self.sock)

    def _waiting(self) -> bool:
        """Whether a frame waits to be read, on the agent's socket or a lane (no reading)."""
        if self.reader.buffered() or select.select([self.sock], [], [], 0)[0]:
            return True
        return self.lanes is not None and self.lanes.waiting()

    def _look_for_frames(self) -> None:
        """From the watchdog: when every slot is inside a task, nobody reads the sockets, yet a
        CANCEL must reach the task it stops. A frame waiting then is read in a thread of its
        own; a task read that way waits in the stash for the next free slot, unless tasks
        here wait for nested work (the agent lent their slots: it runs now, as _read_replies
        runs it)."""
        if self._peeking or self._nested_reader or self.read_lock.locked() or not self._waiting():
            return
        self._peeking = True
        threading.Thread(target=self._peek, name="skyward-peek", daemon=True).start()

    def _peek(self) -> None:
        try:
            if not self.read_lock.acquire(blocking=False):
                return  # a slot reads again: it sees the frame
            try:
                if not self._waiting():
                    return
                try:
                    frame = self._read()
                except (EOFError, OSError):
                    self.exit()
                if frame.kind in (Kind.TASK, Kind.MAP):
                    entry = self._claim(frame)
                    with self.lock:
                        lent = self._awaiting()
                        if not lent:
                            self._stash.append((frame, entry))
                    if lent:
                        threading.Thread(target=self._run, args=(frame, entry), name="skyward-lent-slot",
                                         daemon=True).start()
                    return
            finally:
                self.read_lock.release()
            self._control(frame)
        finally:
            self._peeking = False

    def _next_task(self) -> Frame:
        while True:
            try:
                frame = self._read()
            except (EOFError, OSError):
                self.exit()  # the agent is gone: nothing left to serve
            if frame.kind in (Kind.TASK, Kind.MAP):
                return frame
            self._control(frame)

    def _control(self, frame: Frame) -> None:
        if frame.kind == Kind.REPLY:
            with self.lock:
                done = self._nested.pop(frame.task_id, None)
            if done is not None:
                done(frame)
        elif frame.kind == Kind.CONFIGURE:
            self.configure(json.loads(bytes(frame.body)))
        elif frame.kind == Kind.CREDIT or frame.kind == Kind.STOP:
            with self.lock:
                out = self._streams.get(frame.task_id)
                if out is None and frame.kind == Kind.STOP:
                    self._stop_early(frame.task_id)
            if out is not None:
                if frame.kind == Kind.STOP:
                    out.stop()
                else:
                    from .stream import CREDIT

                    out.credit(*CREDIT.unpack_from(frame.body, 0))
        elif frame.kind == Kind.FEED:
            from .stream import FEED_HEAD

            feed = self._feeds.get((frame.task_id, FEED_HEAD.unpack_from(frame.body, 0)[0]))
            if feed is not None:
                feed.on_feed(frame)
        elif frame.kind == Kind.CANCEL:
            self._cancel(frame.task_id)
        elif frame.kind == Kind.SHUTDOWN:
            self.exit()

    # -- nested dispatch (the client is the hub) ---------------------------------------------
    def submit_nested(self, kind: int, flags: int, body: Any, buffers: serialize.Buffers,
                      done: Callable[[Frame | BaseException], None], parent: int = 0) -> None:
        """Send a TASK/MAP payload up to the client, to run somewhere in the pool; ``done``
        gets the REPLY frame (a RESULT's content) from whichever thread reads it. ``parent``:
        the id of the task that waits for it (default: the one this thread runs); its slot
        is lent meanwhile."""
        nid = next(self._nested_ids)
        parent = parent or context.current_task.get()
        with self.lock:
            self._nested[nid] = done
            start_reader = not self._nested_reader
            self._nested_reader = True
        try:
            self.writer.send_parts(Kind.SUBMIT, nid, flags, NESTED.pack(parent, kind) + bytes(body), buffers)
        except OSError as exc:
            with self.lock:
                self._nested.pop(nid, None)
            done(exc)
        if start_reader:
            threading.Thread(target=self._read_replies, name="skyward-nested", daemon=True).start()

    def _read_replies(self) -> None:
        """Read frames while nested submissions are out. The slots that would read are
        probably all inside tasks waiting for those very replies; a task that arrives here
        meanwhile (the agent lends a waiting task's slot) runs in a thread of its own."""
        while True:
            with self.lock:
                if not self._awaiting():
                    self._nested_reader = False
                    return
                # Read while no task waited (see _peek): what it lends is for them now too.
                stashed, self._stash = self._stash, collections.deque()
            for frame, entry in stashed:
                threading.Thread(target=self._run, args=(frame, entry), name="skyward-lent-slot",
                                 daemon=True).start()
            if not self.read_lock.acquire(timeout=0.05):
                continue  # an idle slot is reading; it handles REPLY frames too
            try:
                with self.lock:
                    if not self._awaiting():
                        self._nested_reader = False
                        return
                try:
                    frame = self._read()
                except (EOFError, OSError):
                    self.exit()
                claimed = self._claim(frame) if frame.kind in (Kind.TASK, Kind.MAP) else None
            finally:
                self.read_lock.release()
            if claimed is not None:
                threading.Thread(target=self._run, args=(frame, claimed), name="skyward-lent-slot",
                                 daemon=True).start()
            else:
                self._control(frame)

    def _awaiting(self) -> bool:
        """Whether some task waits for frames (nested replies, credit, feeds): then a thread
        must read even when every slot is busy (call with self.lock held)."""
        return bool(self._nested or self._streams or self._feeds)

    def _ensure_reader(self) -> None:
        with self.lock:
            start = not self._nested_reader
            self._nested_reader = True
        if start:
            threading.Thread(target=self._read_replies, name="skyward-nested", daemon=True).start()

    # -- streaming (stream.py) ---------------------------------------------------------------
    def open_feed(self, tid: int, index: int) -> Any:
        """The iterator an argument streamed from the client becomes (while unpickling it)."""
        from .stream import FeedIterator

        feed = FeedIterator(self.writer, tid, index)
        with self.lock:
            self._feeds[(tid, index)] = feed
        self._ensure_reader()
        return feed

    def _stop_early(self, tid: int) -> None:
        """Remember a STOP for a stream not registered yet (call with self.lock held). On a
        lane, frames come in order and the TASK was claimed before: only a running task's
        STOP is kept. The agent's ids are never reused, so an old STOP cannot hit a new task."""
        if tid & LANE_BIT and tid not in self.running:
            return
        self._early_stops[tid] = None
        while len(self._early_stops) > _EARLY_STOPS:
            del self._early_stops[next(iter(self._early_stops))]

    def _stream_out(self, tid: int, gen: Any, entry: _Entry) -> None:
        from .stream import OutStream, run_generator

        left: list[float | None] = [None]

        def pause(waiting: bool) -> None:  # the task's timeout does not run while the consumer lags
            if waiting:
                left[0] = None if entry.deadline is None else entry.deadline - time.monotonic()
                entry.deadline = None
            elif left[0] is not None:
                entry.deadline = time.monotonic() + left[0]

        out = OutStream(self.writer, tid, self.spill, pause)
        with self.lock:
            self._streams[tid] = out
            stopped = tid in self._early_stops
            self._early_stops.pop(tid, None)
        if stopped:
            out.stop()  # the consumer gave up before the generator started: it never runs
        self._ensure_reader()
        try:
            run_generator(gen, out)
        finally:
            with self.lock:
                self._streams.pop(tid, None)

    # -- running one task --------------------------------------------------------------------
    def _claim(self, frame: Frame) -> _Entry:
        """Register a task as running here (call holding read_lock: a CANCEL for it, read
        right after it, must find it)."""
        tid = frame.task_id
        entry = _Entry(tid, 0)
        with self.lock:
            self.running[tid] = entry
            if tid & LANE_BIT and self.lanes is not None:
                self.lanes.running(+1)
        return entry

    def _run(self, frame: Frame, entry: _Entry) -> bool:
        """Run a task and answer; True when its thread was given up on meanwhile."""
        tid = frame.task_id
        entry.ident = threading.get_ident()
        token = context.current_task.set(tid)
        payload: tuple[int, Any, serialize.Buffers] | None = None
        try:
            payload = self._execute(frame, entry)
        except TaskTimeoutError:
            payload = None  # injected by the watchdog, which already answered the client
        except _Cancelled:
            payload = None  # answered below, or by _reap_cancelled if it gave up on this thread
        except BaseException as exc:  # our own code failed: still answer, or the client waits forever
            payload = serialize.dumps_error(exc)
        finally:
            for hook in context.task_done_hooks:  # eventual collection writes land before the result
                hook()
            if self._feeds:
                with self.lock:
                    for key in [k for k in self._feeds if k[0] == tid]:
                        del self._feeds[key]
            context.current_task.reset(token)
            for s in self.streams:
                s.flush_task(tid)
        try:
            with entry.lock:
                state = entry.state
                if state != "abandoned":
                    entry.state = "done"
            if state == "cancelled":
                # An interruption not delivered yet must not land while the answer is written.
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(entry.ident), None)
                payload = serialize.dumps_error(_cancelled_error(entry), tb_text="")
            with self.lock:
                if self.running.pop(tid, None) is not None and tid & LANE_BIT and self.lanes is not None:
                    self.lanes.running(-1)
                self._early_stops.pop(tid, None)
            if state not in ("timed_out", "abandoned") and payload is not None:
                self._send_result(tid, payload)
        except (TaskTimeoutError, _Cancelled):  # a late async exception landing in our own code
            pass
        with self.lock:  # read after the pop above: _reap decides on what it finds running
            return entry.gone

    def _execute(self, frame: Frame, entry: _Entry) -> tuple[int, Any, serialize.Buffers]:
        try:
            task = serialize.loads_frame(frame)
        except Exception as exc:
            node = context.topology().get("node", "?") if context.on_node() else "?"
            return serialize.dumps_error(
                SerializationError(
                    f"the task could not be unpickled on node {node} ({type(exc).__name__}: {exc}). "
                    f"Everything the function needs must be importable on the nodes: add missing "
                    f"packages with Image(pip=[...]) and your own modules with Image(includes=[...])."
                )
            )
        if frame.kind == Kind.TASK:
            fn, args, kwargs, timeout, *trace = task
            items = None
        else:
            fn, items, timeout, *trace = task
            args, kwargs = (), {}
        entry.name = getattr(fn, "__qualname__", "task")
        if self.plugins is not None:
            self.plugins.enter_process(self._info())
            if self.plugins.error is not None:
                return serialize.dumps_error(self.plugins.error, tb_text="")
            fn = self.plugins.wrap(fn)
        if timeout:
            entry.timeout = timeout * (len(items) if items is not None else 1)
            entry.deadline = time.monotonic() + entry.timeout
        with entry.lock:
            if entry.state == "cancelled":  # while it was loading: it never starts
                return serialize.dumps_error(_cancelled_error(entry), tb_text="")
            entry.state = "running"
        # A traced client sends its task span's traceparent last: spans the task opens join it.
        traced = _otel.attach(trace[0]) if trace else None
        seconds: float | None = None
        try:
            if items is None:
                value = fn(*args, **kwargs)
                if frame.flags & FLAG_STREAM_OUT and hasattr(value, "__next__"):
                    self._stream_out(frame.task_id, value, entry)  # values go out as YIELD frames
                    value = None
            else:
                began = time.perf_counter()
                value = list(map(fn, items))  # (no bytecode per item, as multiprocessing.Pool)
                seconds = time.perf_counter() - began
        except BaseException as exc:
            with entry.lock:
                _stopped_first(entry, exc)
                entry.state = "returning"
            if isinstance(exc, SystemExit | KeyboardInterrupt):
                exc = RuntimeError(f"{entry.name} raised {type(exc).__name__}({exc})")
            return serialize.dumps_error(exc)
        finally:
            if traced is not None:
                _otel.detach(traced)
        with entry.lock:
            _stopped_first(entry)
            entry.state = "returning"
        # A map chunk's result says how long its calls took: the client sizes the next chunks by it.
        return serialize.dumps_ok(value, entry.name, self.spill, seconds)

    # -- timeouts ----------------------------------------------------------------------------
    def _watchdog(self) -> None:
        parent = os.getppid()
        # The agent's pid as the agent said it (SKYWARD_AGENT_PID): a worker whose agent died
        # before this thread started has init as its parent from the start, and a launcher
        # may stand between the two.
        agent = int(os.environ.get("SKYWARD_AGENT_PID") or 0)
        ticks = 0
        while True:
            time.sleep(0.05)
            ticks += 1
            if os.getppid() != parent or (agent and ticks % 20 == 0 and not _alive(agent)):
                # The agent is gone (killed outright). Busy slots read no frames, so this is
                # how a worker notices; it takes what its tasks started with it.
                os.killpg(0, signal.SIGKILL)
            now = time.monotonic()
            with self.lock:
                late = [e for e in self.running.values() if e.deadline is not None and e.deadline < now]
            for entry in late:
                self._time_out(entry)
            self._look_for_frames()

    def _time_out(self, entry: _Entry) -> None:
        with entry.lock:
            if entry.state != "running":
                return
            entry.state = "timed_out"
            node = context.topology().get("node", "?") if context.on_node() else "?"
            err = TaskTimeoutError(
                f"{entry.name} ran longer than its timeout of {entry.timeout:g} s on node {node} and "
                f"was cancelled there. Raise the limit with @sky.function(timeout=...) or "
                f"pending.with_timeout(seconds), or Options(default_compute_timeout=...)."
            )
            if self.exclusive:
                # Process executor: the only sure way to stop the task is to end this process.
                # Tell the agent first, so it starts a replacement and sends nothing more here.
                self.writer.send_parts(Kind.SHUTDOWN, 0, 0, b"")
                self._send_result(entry.task_id, serialize.dumps_error(err, tb_text=""))
                os._exit(75)
            self._send_result(entry.task_id, serialize.dumps_error(err, tb_text=""))
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(entry.ident), ctypes.py_object(TaskTimeoutError)
            )
        threading.Thread(target=self._reap, args=(entry,), daemon=True).start()

    # -- cancellation (the caller gave up: joblib aborted the call) ------------------------
    def _cancel(self, tid: int) -> None:
        """CANCEL: stop a task of this worker. It is interrupted; a thread that does not unwind
        within _CANCEL_GRACE has its slot replaced (process executor: the process exits and
        the agent replaces it). The task answers TaskCancelledError only once its slot is free
        again, so a caller that waits for the answers knows the node can take new work."""
        with self.lock:
            entry = self.running.get(tid)
            stashed = next((item for item in self._stash if item[1] is entry), None)
            if stashed is not None:  # read while every slot was busy: it never starts
                self._stash.remove(stashed)
                if self.running.pop(tid, None) is not None and tid & LANE_BIT and self.lanes is not None:
                    self.lanes.running(-1)
        if stashed is not None:
            self._send_result(tid, serialize.dumps_error(_cancelled_error(stashed[1]), tb_text=""))
            return
        if entry is None:
            return  # it has answered already (the RESULT is on its way)
        with entry.lock:
            if entry.state not in ("loading", "running"):
                return  # timed out, cancelled already, or returning its result
            interrupt = entry.state == "running"
            entry.state = "cancelled"
            if interrupt:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(entry.ident), ctypes.py_object(_Cancelled))
        threading.Thread(target=self._reap_cancelled, args=(entry,), name="skyward-cancel", daemon=True).start()

    def _reap_cancelled(self, entry: _Entry) -> None:
        end = time.monotonic() + _CANCEL_GRACE
        while time.monotonic() < end:
            time.sleep(0.005)
            if entry.state != "cancelled":
                return  # the thread unwound and answered
        with entry.lock:
            if entry.state != "cancelled":
                return
            entry.state = "abandoned"
        err = serialize.dumps_error(_cancelled_error(entry), tb_text="")
        if self.exclusive:  # the only sure way to stop it; the agent starts a new process
            self.writer.send_parts(Kind.SHUTDOWN, 0, 0, b"")
            self._send_result(entry.task_id, err)
            os._exit(75)
        with self.lock:
            entry.gone = True
            if self.running.pop(entry.task_id, None) is not None and entry.task_id & LANE_BIT and self.lanes is not None:
                self.lanes.running(-1)
        self._start_slot()  # before the answer: when the caller hears it, the slot is there
        self._send_result(entry.task_id, err)

    def _reap(self, entry: _Entry) -> None:
        time.sleep(_GRACE)
        with self.lock:
            stuck = entry.task_id in self.running
            if stuck:
                entry.gone = True
        if stuck:
            self.log(
                f"skyward: {entry.name} (task {entry.task_id}) did not stop after its timeout "
                f"(it is blocked outside Python code); it keeps running in the background and a "
                f"new slot replaces it. Use Worker(executor='process') to have such tasks killed."
            )
            self._start_slot()


def _stopped_first(entry: _Entry, exc: BaseException | None = None) -> None:
    """As a task returns or raises (call holding ``entry.lock``): when a CANCEL or its timeout
    came first, the exception injected into its thread may not have landed yet, e.g. the task
    was leaving a C call. It must not land later, in the worker's own code: the answer would go
    unsent (a cancelled batch that never answers holds joblib's abort for 30 s) or the slot's
    thread would end. It is withdrawn here and raised now, so the task ends as stopped;
    the state says how it is answered (cancelled: TaskCancelledError, timed out: already)."""
    if entry.state == "running":
        return
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(entry.ident), None)
    if exc is not None and isinstance(exc, TaskTimeoutError | _Cancelled):
        raise exc  # it landed: the usual way
    if entry.state == "timed_out":
        raise TaskTimeoutError(f"{entry.name} timed out")
    raise _Cancelled()


def _cancelled_error(entry: _Entry) -> TaskCancelledError:
    node = context.topology().get("node", "?") if context.on_node() else "?"
    return TaskCancelledError(
        f"{entry.name} was cancelled on node {node}: its caller gave up on it (joblib aborted the "
        f"call after a timeout or another task's error); its result would have been ignored."
    )


def main() -> None:
    addr = os.environ.pop("SKYWARD_WORKER_ADDR", "")
    if addr:  # started by a plugin launcher (possibly one of several processes): call back
        from .handshake import prove, welcome

        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(addr)
        key = bytes.fromhex(os.environ.pop("SKYWARD_WORKER_KEY", ""))
        from .envblock import scrub

        scrub("SKYWARD_WORKER_KEY")  # out of /proc/self/environ too, before any task runs
        welcome(sock, prove(sock, key, {"pid": os.getpid()}), "the agent that launched this worker")
    else:
        sock = socket.socket(fileno=int(os.environ.pop("SKYWARD_WORKER_FD")))
    tune(sock)
    lane_fd = os.environ.pop("SKYWARD_LANE_FD", "")
    count_fd = os.environ.pop("SKYWARD_LANE_COUNT_FD", "")
    worker = Worker(
        sock,
        threads=int(os.environ.pop("SKYWARD_WORKER_THREADS", "1")),
        exclusive=os.environ.pop("SKYWARD_WORKER_EXCLUSIVE", "0") == "1",
        lane_listener=socket.socket(fileno=int(lane_fd)) if lane_fd else None,
        lane_count=LaneCount(int(count_fd)) if count_fd else None,
    )
    run(worker)


def spare(sock: socket.socket, lane_listener: socket.socket | None, lane_count: LaneCount | None) -> None:
    """A spare worker forked from its agent (forked.py): its settings come with CONFIGURE."""
    tune(sock)
    run(Worker(sock, threads=1, exclusive=False, lane_listener=lane_listener, lane_count=lane_count))


def run(worker: Worker) -> None:
    """Wait for the node's configuration, then serve until the worker exits."""
    # While the client connects and configures: the first task is unpickled with it when its
    # function came by value, and results are pickled with it (serialize loads it on first use).
    import cloudpickle  # noqa: F401
    try:
        first = worker.reader.read()
    except (EOFError, OSError):
        raise SystemExit(0) from None  # a spare worker the agent did not need (see Supervisor.prestart)
    if first.kind != Kind.CONFIGURE:
        raise SystemExit("skyward worker: expected CONFIGURE first")
    config = json.loads(bytes(first.body))
    if "threads" in config:  # a spare started before the agent knew its settings
        worker.threads, worker.exclusive = int(config["threads"]), bool(config["exclusive"])
    worker.configure(config)
    worker.serve()


if __name__ == "__main__":
    main()
