"""Where skyward's own log records go: a rotating private file, and warnings on stderr.

    handle = configure(LogConfig(level="DEBUG", rotation="1 day"))
    ...
    handle.close()

Everything is attached to the ``"skyward"`` logger (children such as ``"skyward.core.pool"``
flow into it). The rules:

* The file gets every record at ``level`` and above, in the format
  ``"%(asctime)s %(levelname)s %(name)s: %(message)s"``. Its folder is created 0700 and the
  file (and every file rotation opens) is 0600: logs describe your infrastructure.
* The console (stderr, when ``console`` is true) shows WARNING and above, or ``level`` if
  that is higher: a pool logs a lot at INFO and the terminal belongs to the user's program.
  Full detail is in the file.
* Every handler added carries a :class:`~skyward.observe.secrets.RedactingFilter`.
* While any configuration is open the logger does not propagate to the root logger, so an
  application's own ``basicConfig`` does not print skyward's records a second time.
  ``configure(False)`` touches nothing at all: the application owns logging then, and
  skyward's records go wherever its logging setup sends them.
* Configurations are reference-counted per file: configuring the same file twice shares
  one handler (no duplicated lines), and the handler goes away when the last user closes.
  When several open configurations disagree on the level, the most verbose one wins; on
  rotation and retention of a shared file, the first one wins.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyward.bootstrap.procs import hold_over_fork
from skyward.errors import ConfigError
from skyward.observe.secrets import RedactingFilter
from skyward.paths import skyward_home

__all__ = ["LEVELS", "TRACE", "LogConfig", "LogHandle", "configure"]

TRACE = 5
logging.addLevelName(TRACE, "TRACE")

LEVELS: dict[str, int] = {
    "TRACE": TRACE,
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
}

FILE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
CONSOLE_FORMAT = "%(levelname)s %(name)s: %(message)s"
LOGGER_NAME = "skyward"

# Binary units (1 KB = 1024 B): log sizes are about disk blocks, and it is what most
# loggers mean by "MB". KiB/MiB/GiB are accepted as the same thing.
_SIZE_UNITS = {
    "B": 1,
    "KB": 1024,
    "KIB": 1024,
    "MB": 1024**2,
    "MIB": 1024**2,
    "GB": 1024**3,
    "GIB": 1024**3,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*$", re.IGNORECASE)
# Unit word -> TimedRotatingFileHandler "when" and the multiplier on the count (a week is
# rotated as 7 days, so "2 weeks" means every 14 days from the start, not on a weekday).
_TIME_UNITS = {
    "second": ("S", 1),
    "minute": ("M", 1),
    "hour": ("H", 1),
    "day": ("D", 1),
    "week": ("D", 7),
}
_TIME_RE = re.compile(r"^\s*(\d+)\s*([a-z]+?)s?\s*$", re.IGNORECASE)
# Calendar keywords rotate on the boundary, not N units after start.
_TIME_KEYWORDS = {
    "hourly": ("H", 1),
    "daily": ("MIDNIGHT", 1),
    "midnight": ("MIDNIGHT", 1),
    "weekly": ("W0", 1),  # Mondays at midnight
}
_ROTATION_HELP = (
    'Use a size such as "50 MB", "10KB", "1 GB", "500 B" (units B, KB, MB, GB; 1 KB = 1024 B) '
    'or a time such as "1 day", "12 hours", "30 minutes", "1 week", "daily", "hourly".'
)


@dataclass(frozen=True, slots=True)
class _SizeRotation:
    max_bytes: int


@dataclass(frozen=True, slots=True)
class _TimeRotation:
    when: str
    interval: int


def _parse_rotation(text: str) -> _SizeRotation | _TimeRotation:
    """Parse a rotation spec; ConfigError naming the value if it is not one."""
    if not isinstance(text, str):
        raise ConfigError(
            f"LogConfig(rotation={text!r}) is not valid: rotation is a string. {_ROTATION_HELP}"
        )
    key = text.strip().lower()
    if key in _TIME_KEYWORDS:
        return _TimeRotation(*_TIME_KEYWORDS[key])
    m = _TIME_RE.match(key)
    if m and m.group(2) in _TIME_UNITS:
        count = int(m.group(1))
        if count < 1:
            raise ConfigError(
                f"LogConfig(rotation={text!r}) is not valid: a rotation interval must be at "
                f"least 1. {_ROTATION_HELP}"
            )
        when, factor = _TIME_UNITS[m.group(2)]
        return _TimeRotation(when, count * factor)
    m = _SIZE_RE.match(text)
    if m and m.group(2).upper() in _SIZE_UNITS:
        size = int(float(m.group(1)) * _SIZE_UNITS[m.group(2).upper()])
        if size < 1:
            raise ConfigError(
                f"LogConfig(rotation={text!r}) is not valid: a rotation size must be at least "
                f"1 byte. {_ROTATION_HELP}"
            )
        return _SizeRotation(size)
    raise ConfigError(f"LogConfig(rotation={text!r}) is not valid. {_ROTATION_HELP}")


@dataclass(frozen=True, slots=True)
class LogConfig:
    """How skyward logs; ``Options(logging=...)`` takes one (or True/False).

    ``level``: TRACE, DEBUG, INFO, WARNING or ERROR (any case; stored upper-cased).
    ``file``: the log file; None means ``skyward_home()/logs/skyward.log``, resolved when
    configured so that SKYWARD_HOME is honoured.
    ``console``: also show WARNING and above (or ``level`` if higher) on stderr.
    ``rotation``: a size ("50 MB", 1 KB = 1024 B) or a time ("1 day", "daily", "hourly").
    ``retention``: how many rotated files to keep besides the current one.
    """

    level: str = "INFO"
    file: str | None = None
    console: bool = True
    rotation: str = "50 MB"
    retention: int = 10

    def __post_init__(self) -> None:
        if not isinstance(self.level, str) or self.level.upper() not in LEVELS:
            raise ConfigError(
                f"LogConfig(level={self.level!r}) is not valid: use one of "
                f"{', '.join(LEVELS)} (any case)."
            )
        object.__setattr__(self, "level", self.level.upper())
        if self.file is not None:
            if not isinstance(self.file, str | os.PathLike) or not os.fspath(self.file):
                raise ConfigError(
                    f"LogConfig(file={self.file!r}) is not valid: use a path string, or None "
                    f"for the default {skyward_home() / 'logs' / 'skyward.log'}."
                )
            object.__setattr__(self, "file", os.fspath(self.file))
        if not isinstance(self.console, bool):
            raise ConfigError(
                f"LogConfig(console={self.console!r}) is not valid: use True or False."
            )
        if isinstance(self.retention, bool) or not isinstance(self.retention, int):
            raise ConfigError(
                f"LogConfig(retention={self.retention!r}) is not valid: retention is the number "
                f"of rotated files to keep, an int of at least 1. Use e.g. retention=10."
            )
        if self.retention < 1:
            raise ConfigError(
                f"LogConfig(retention={self.retention!r}) is not valid: keep at least 1 rotated "
                f"file. Use e.g. retention=10."
            )
        _parse_rotation(self.rotation)

    @property
    def levelno(self) -> int:
        return LEVELS[self.level]

    def resolved_file(self) -> Path:
        """The absolute log file path this config writes to (SKYWARD_HOME read now)."""
        path = (
            Path(self.file).expanduser() if self.file else skyward_home() / "logs" / "skyward.log"
        )
        return path.resolve()


class _PrivateFileMixin:
    """Opens the log file 0600, including the fresh file each rotation creates."""

    baseFilename: str
    encoding: str | None
    errors: str | None

    def _open(self) -> Any:
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            # An existing file keeps its mode through os.open; tighten it too. A file only: a
            # log sent to a device (file="/dev/null", "/dev/stderr") must not change the
            # device's mode, which as root would lock every other user out of it.
            if stat.S_ISREG(os.fstat(fd).st_mode):
                os.fchmod(fd, 0o600)
        except OSError:
            pass  # not ours to chmod (e.g. a file owned by someone else we may append to)
        return os.fdopen(fd, "a", encoding=self.encoding, errors=self.errors)


class _SizeCheckMixin:
    """A size-rotated file's check, one ``fstat`` per record: the standard one stats the path
    twice, then seeks and tells through the text layer (the slow part), and formats the record
    to measure it, after which ``emit`` formats it again. Each event of a pool's start is a
    record (a dozen a node), so that was 60 us of the client's CPU per event. The record's text
    is kept from the check for the emit (both under the handler's lock). Other processes may
    append to the same file, so the size is the file's, not a count of what this one wrote."""

    maxBytes: int
    stream: Any
    _kept: tuple[logging.LogRecord, str] | None = None

    def shouldRollover(self, record: logging.LogRecord) -> bool:
        if self.stream is None:  # (opened lazily, as the standard handler does)
            self.stream = self._open()  # type: ignore[attr-defined]
        if self.maxBytes <= 0:
            return False
        try:
            st = os.fstat(self.stream.fileno())
        except (OSError, ValueError):
            return False
        # Never roll over anything but a regular file (a log pointed at /dev/stderr: bpo-45401).
        return stat.S_ISREG(st.st_mode) and st.st_size + len(self.format(record)) + 1 >= self.maxBytes

    def format(self, record: logging.LogRecord) -> str:
        kept = self._kept
        if kept is not None and kept[0] is record:
            return kept[1]
        text: str = super().format(record)  # type: ignore[misc]
        self._kept = (record, text)
        return text

    def emit(self, record: logging.LogRecord) -> None:
        try:
            super().emit(record)  # type: ignore[misc]
        finally:
            self._kept = None


def _rotating(by_size: bool) -> Any:
    """The rotating file handler that opens its files 0600 (logging.handlers, which imports
    much, is loaded only when a pool logs to a file)."""
    import logging.handlers

    if by_size:
        base: type = logging.handlers.RotatingFileHandler
        mixins: tuple[type, ...] = (_SizeCheckMixin, _PrivateFileMixin)
    else:
        base, mixins = logging.handlers.TimedRotatingFileHandler, (_PrivateFileMixin,)
    return type(base.__name__.replace("Rotating", "PrivateRotating"), (*mixins, base), {})


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at emit time (pytest, Jupyter and rich swap it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def _open_file_handler(config: LogConfig, path: Path) -> logging.Handler:
    folder = path.parent
    try:
        if not folder.exists():
            # exist_ok: another program may make it at the same moment (two pools starting).
            folder.mkdir(parents=True, mode=0o700, exist_ok=True)
            # mkdir's mode is filtered by the umask; make it exactly 0700.
            folder.chmod(0o700)
        rotation = _parse_rotation(config.rotation)
        handler: logging.Handler
        if isinstance(rotation, _SizeRotation):
            handler = _rotating(by_size=True)(
                path, maxBytes=rotation.max_bytes, backupCount=config.retention, encoding="utf-8"
            )
        else:
            handler = _rotating(by_size=False)(
                path,
                when=rotation.when,
                interval=rotation.interval,
                backupCount=config.retention,
                encoding="utf-8",
            )
    except OSError as exc:
        raise ConfigError(
            f"log file {str(path)!r} cannot be opened: {exc}. Pass LogConfig(file=...) with a "
            f"writable path, or logging=False to leave logging to your application."
        ) from exc
    handler.setFormatter(logging.Formatter(FILE_FORMAT))
    handler.addFilter(RedactingFilter())
    return handler


def _open_console_handler() -> logging.Handler:
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter(CONSOLE_FORMAT))
    handler.addFilter(RedactingFilter())
    return handler


class LogHandle:
    """What one :func:`configure` call set up; :meth:`close` gives it back (idempotent).

    Also a context manager. A handle from ``configure(False)`` holds nothing.
    """

    __slots__ = ("_closed", "config", "file")

    def __init__(self, config: LogConfig | None, file: Path | None) -> None:
        self.config = config
        self.file = file
        self._closed = config is None

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def handlers(self) -> tuple[logging.Handler, ...]:
        """The (possibly shared) handlers this handle uses; empty once closed."""
        with _lock:
            if self._closed or self.config is None:
                return ()
            found: list[logging.Handler] = []
            if self.file is not None and str(self.file) in _files:
                found.append(_files[str(self.file)])
            if self.config.console and _console is not None:
                found.append(_console)
            return tuple(found)

    def close(self) -> None:
        with _lock:
            if self._closed:
                return
            self._closed = True
            _open_handles.remove(self)
            _release(self)

    def __enter__(self) -> LogHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"LogHandle(file={str(self.file) if self.file else None!r}, {state})"


# Process-wide state, guarded by _lock. The handlers live on the "skyward" logger; these
# tables say which open handles use them.
_lock = threading.RLock()
_open_handles: list[LogHandle] = []
_files: dict[str, logging.Handler] = {}
_console: logging.Handler | None = None
# The logger's level and propagate flag before the first open configuration, restored after
# the last one closes.
_saved: tuple[int, bool] | None = None


def configure(config: LogConfig | bool) -> LogHandle:
    """Set up skyward's logging; close the returned handle when done (e.g. at pool close).

    ``True`` means ``LogConfig()``; ``False`` changes nothing and returns an empty handle.
    """
    global _console, _saved
    if config is True:
        config = LogConfig()
    elif config is False:
        return LogHandle(None, None)
    elif not isinstance(config, LogConfig):
        raise ConfigError(
            f"logging={config!r} is not valid: use True (defaults), False (leave logging to "
            f"your application) or sky.LogConfig(...)."
        )
    logger = logging.getLogger(LOGGER_NAME)
    path = config.resolved_file()
    key = str(path)
    with _lock:
        # Build what is missing before touching shared state, so a failure leaves none behind.
        new_file = _open_file_handler(config, path) if key not in _files else None
        new_console = _open_console_handler() if config.console and _console is None else None
        if not _open_handles:
            _saved = (logger.level, logger.propagate)
        if new_file is not None:
            _files[key] = new_file
            logger.addHandler(new_file)
        if new_console is not None:
            _console = new_console
            logger.addHandler(new_console)
        handle = LogHandle(config, path)
        _open_handles.append(handle)
        _apply_levels()
        return handle


def _release(handle: LogHandle) -> None:
    """Remove the handlers no open handle uses any more (caller holds _lock)."""
    global _console, _saved
    logger = logging.getLogger(LOGGER_NAME)
    active = _active()
    key = str(handle.file)
    if key in _files and not any(k == key for _, k in active):
        handler = _files.pop(key)
        logger.removeHandler(handler)
        handler.close()
    if _console is not None and not any(c.console for c, _ in active):
        logger.removeHandler(_console)
        _console.close()
        _console = None
    if active:
        _apply_levels()
    elif _saved is not None:
        logger.setLevel(_saved[0])
        logger.propagate = _saved[1]
        _saved = None


def _forget_parents_handlers() -> None:
    """In a forked child: the open configurations are the parent's pools'. Their handlers leave
    the logger here without being flushed or closed: a child that logged through them would
    rotate the parent's file under it, and a line buffered at the fork would be written twice.
    Each file's descriptor is pointed at /dev/null in this process only (the parent's stays as
    it was), so whatever flushes the old handler later (logging's exit hook) writes nothing. The
    logger gets back the level and propagation it had before; a pool this process opens
    configures its own handlers."""
    global _lock, _console, _saved
    _lock = threading.RLock()  # another thread may have held it at the fork
    logger = logging.getLogger(LOGGER_NAME)
    for handler in [*_files.values(), *([_console] if _console is not None else [])]:
        logger.removeHandler(handler)
    for handler in _files.values():
        stream = getattr(handler, "stream", None)
        try:
            fd = stream.fileno() if stream is not None else -1
        except (OSError, ValueError):
            continue
        if fd >= 0:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)
    for handle in _open_handles:
        handle._closed = True  # closing it here gives back nothing: it is the parent's
    _open_handles.clear()
    _files.clear()
    _console = None
    if _saved is not None:
        logger.setLevel(_saved[0])
        logger.propagate = _saved[1]
        _saved = None


# Our handlers write and flush under their locks: a fork waits for a write in progress (a thread
# inside one when another forks would leave the file's buffer locked in the child for good).
hold_over_fork(lambda: [*_files.values(), *([_console] if _console is not None else [])])
os.register_at_fork(after_in_child=_forget_parents_handlers)


def _apply_levels() -> None:
    """Levels from the open handles: the most verbose request wins (caller holds _lock)."""
    logger = logging.getLogger(LOGGER_NAME)
    active = _active()
    logger.setLevel(min(c.levelno for c, _ in active))
    logger.propagate = False
    for key, handler in _files.items():
        handler.setLevel(min(c.levelno for c, k in active if k == key))
    if _console is not None:
        _console.setLevel(min(max(logging.WARNING, c.levelno) for c, _ in active if c.console))


def _active() -> list[tuple[LogConfig, str]]:
    """(config, file key) of every open handle (caller holds _lock)."""
    return [(h.config, str(h.file)) for h in _open_handles if h.config is not None]
