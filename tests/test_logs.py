from __future__ import annotations

import logging
import logging.handlers
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import skyward.observe.secrets as secrets
from skyward.errors import ConfigError
from skyward.observe.logs import TRACE, LogConfig, LogHandle, configure


@pytest.fixture
def logger() -> logging.Logger:
    return logging.getLogger("skyward.test_logs")


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., LogHandle]]:
    """configure() with a file under tmp_path and no console; every handle closed after."""
    handles: list[LogHandle] = []

    def _make(config: LogConfig | bool | None = None, **kwargs: object) -> LogHandle:
        if config is None:
            kwargs.setdefault("file", str(tmp_path / "logs" / "skyward.log"))
            kwargs.setdefault("console", False)
            config = LogConfig(**kwargs)  # type: ignore[arg-type]
        handle = configure(config)
        handles.append(handle)
        return handle

    yield _make
    for handle in handles:
        handle.close()
    assert not _our_handlers()


def _our_handlers() -> list[logging.Handler]:
    # Only skyward's: pytest attaches its own capture handlers to non-propagating loggers.
    return [
        h
        for h in logging.getLogger("skyward").handlers
        if any(isinstance(f, secrets.RedactingFilter) for f in h.filters)
    ]


def _flush() -> None:
    for handler in _our_handlers():
        handler.flush()


def test_defaults() -> None:
    config = LogConfig()
    assert (config.level, config.file, config.console, config.rotation, config.retention) == (
        "INFO",
        None,
        True,
        "50 MB",
        10,
    )


def test_default_file_is_under_skyward_home(skyward_home: Path) -> None:
    assert LogConfig().resolved_file() == (skyward_home / "logs" / "skyward.log").resolve()


def test_level_is_case_insensitive() -> None:
    assert LogConfig(level="debug").level == "DEBUG"
    assert LogConfig(level="Trace").levelno == TRACE
    assert logging.getLevelName(TRACE) == "TRACE"


@pytest.mark.parametrize("level", ["VERBOSE", "CRITICAL", "", 10])
def test_bad_level(level: object) -> None:
    with pytest.raises(ConfigError) as info:
        LogConfig(level=level)  # type: ignore[arg-type]
    assert repr(level) in str(info.value)
    assert "TRACE, DEBUG, INFO, WARNING, ERROR" in str(info.value)


@pytest.mark.parametrize("retention", [0, -1, True, 2.5, "3"])
def test_bad_retention(retention: object) -> None:
    with pytest.raises(ConfigError) as info:
        LogConfig(retention=retention)  # type: ignore[arg-type]
    assert f"retention={retention!r}" in str(info.value)


@pytest.mark.parametrize(
    "rotation",
    ["50", "MB", "50 XB", "0 MB", "0 days", "1 fortnight", "-1 MB", "", 1024, "1.5 days"],
)
def test_bad_rotation(rotation: object) -> None:
    with pytest.raises(ConfigError) as info:
        LogConfig(rotation=rotation)  # type: ignore[arg-type]
    assert f"rotation={rotation!r}" in str(info.value)
    assert "50 MB" in str(info.value)


def test_bad_console_and_file() -> None:
    with pytest.raises(ConfigError, match="console='yes'"):
        LogConfig(console="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="file=''"):
        LogConfig(file="")


def test_configure_refuses_other_values() -> None:
    with pytest.raises(ConfigError, match="logging='debug'"):
        configure("debug")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("rotation", "max_bytes"),
    [
        ("500 B", 500),
        ("10KB", 10 * 1024),
        ("1 kb", 1024),
        ("50 MB", 50 * 1024**2),
        ("1.5 MB", int(1.5 * 1024**2)),
        ("1 GB", 1024**3),
        ("2 MiB", 2 * 1024**2),
    ],
)
def test_size_rotation_builds_rotating_handler(
    make: Callable[..., LogHandle], rotation: str, max_bytes: int
) -> None:
    handle = make(rotation=rotation, retention=4)
    (handler,) = handle.handlers
    assert isinstance(handler, logging.handlers.RotatingFileHandler)
    assert handler.maxBytes == max_bytes
    assert handler.backupCount == 4


@pytest.mark.parametrize(
    ("rotation", "when", "seconds"),
    [
        ("1 day", "D", 86400),
        ("12 hours", "H", 12 * 3600),
        ("30 minutes", "M", 30 * 60),
        ("1 minute", "M", 60),
        ("1 week", "D", 7 * 86400),
        ("2 weeks", "D", 14 * 86400),
        ("daily", "MIDNIGHT", 86400),
        ("hourly", "H", 3600),
        ("10 seconds", "S", 10),
        (" 3 Days ", "D", 3 * 86400),
    ],
)
def test_time_rotation_builds_timed_handler(
    make: Callable[..., LogHandle], rotation: str, when: str, seconds: int
) -> None:
    handle = make(rotation=rotation, retention=5)
    (handler,) = handle.handlers
    assert isinstance(handler, logging.handlers.TimedRotatingFileHandler)
    # The handler stores "when" upper-cased and the interval in seconds.
    assert handler.when == when
    assert handler.interval == seconds
    assert handler.backupCount == 5


def test_a_size_rotated_file_formats_each_record_once_and_counts_what_others_wrote(
    make: Callable[..., LogHandle], logger: logging.Logger
) -> None:
    handle = make(rotation="1 KB", retention=2)
    (handler,) = handle.handlers
    assert handle.file is not None
    formatted: list[str] = []
    inner = handler.formatter or logging.Formatter()

    class Counting(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            formatted.append(record.getMessage())
            return inner.format(record)

    handler.setFormatter(Counting())
    logger.info("first")
    assert formatted == ["first"]  # the size check's text is the one written
    # Another program appending to the same file: its bytes count toward the limit.
    with open(handle.file, "ab") as other:
        other.write(b"y" * 1000 + b"\n")
    logger.info("second")
    _flush()
    assert formatted == ["first", "second"]
    assert "second" not in (handle.file.parent / "skyward.log.1").read_text()
    assert "y" * 1000 in (handle.file.parent / "skyward.log.1").read_text()
    assert "second" in handle.file.read_text()


def test_a_log_on_a_device_keeps_the_devices_mode_and_is_never_rolled_over(make: Callable[..., LogHandle]) -> None:
    before = stat.S_IMODE(os.stat("/dev/null").st_mode)
    try:
        handle = make(file="/dev/null", rotation="1 KB", retention=2)
        (handler,) = handle.handlers
        record = logging.LogRecord("skyward.x", logging.INFO, __file__, 1, "z" * 5000, (), None)
        assert not handler.shouldRollover(record)  # type: ignore[attr-defined]
        logging.getLogger("skyward.test_logs").info("to the device")
        # (0600 on /dev/null, as root, broke every other user's shell redirections)
        assert stat.S_IMODE(os.stat("/dev/null").st_mode) == before
    finally:
        if stat.S_IMODE(os.stat("/dev/null").st_mode) != before:
            os.chmod("/dev/null", before)


def test_size_rotation_keeps_exactly_retention_files(
    make: Callable[..., LogHandle], logger: logging.Logger, tmp_path: Path
) -> None:
    handle = make(rotation="1 KB", retention=3)
    for i in range(200):
        logger.info("line %d %s", i, "x" * 60)
    _flush()
    assert handle.file is not None
    folder = handle.file.parent
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["skyward.log", "skyward.log.1", "skyward.log.2", "skyward.log.3"]
    for path in folder.iterdir():
        assert path.stat().st_size <= 1024
        # Files opened by rotation are private too.
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # The newest lines are in the current file, the oldest are gone.
    assert "line 199 " in handle.file.read_text()
    assert "line 0 " not in "".join(p.read_text() for p in folder.iterdir())


def test_permissions(make: Callable[..., LogHandle], tmp_path: Path) -> None:
    handle = make(file=str(tmp_path / "new" / "deeper" / "sky.log"))
    assert handle.file is not None
    assert stat.S_IMODE(handle.file.stat().st_mode) == 0o600
    assert stat.S_IMODE(handle.file.parent.stat().st_mode) == 0o700


def test_existing_file_is_made_private(make: Callable[..., LogHandle], tmp_path: Path) -> None:
    path = tmp_path / "old.log"
    path.write_text("earlier\n")
    path.chmod(0o644)
    make(file=str(path))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == "earlier\n"


def test_unwritable_file_is_a_config_error(make: Callable[..., LogHandle], tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="cannot be opened"):
        make(file=str(blocker / "sky.log"))
    assert not _our_handlers()


def test_format_and_level_filtering(make: Callable[..., LogHandle], logger: logging.Logger) -> None:
    handle = make(level="WARNING")
    logger.debug("debug-line")
    logger.info("info-line")
    logger.warning("warning-line %s", "arg")
    _flush()
    assert handle.file is not None
    text = handle.file.read_text()
    assert "debug-line" not in text
    assert "info-line" not in text
    assert " WARNING skyward.test_logs: warning-line arg" in text
    assert logging.getLogger("skyward").level == logging.WARNING


def test_trace_level(make: Callable[..., LogHandle], logger: logging.Logger) -> None:
    handle = make(level="TRACE")
    logger.log(TRACE, "trace-line")
    logger.log(TRACE - 1, "below-trace")
    _flush()
    assert handle.file is not None
    text = handle.file.read_text()
    assert " TRACE skyward.test_logs: trace-line" in text
    assert "below-trace" not in text


def test_info_config_drops_trace(make: Callable[..., LogHandle], logger: logging.Logger) -> None:
    handle = make(level="INFO")
    logger.log(TRACE, "trace-line")
    logger.debug("debug-line")
    _flush()
    assert handle.file is not None
    assert handle.file.read_text() == ""


def test_secrets_never_reach_the_file(
    make: Callable[..., LogHandle],
    logger: logging.Logger,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(secrets, "_REGISTRY", secrets._Registry())
    handle = make(console=True)
    api_key = secrets.secret("sk-live-0123456789")
    hf_token = "hf_AbCdEfGhIjKlMnOp"
    secrets.register_env({"HF_TOKEN": hf_token, "KERAS_BACKEND": "jax"})

    logger.info("using key %s and token %s with backend %s", api_key, hf_token, "jax")
    logger.info(f"inline {api_key} {hf_token}")
    logger.warning("config %r", {"HF_TOKEN": hf_token})
    try:
        raise RuntimeError(f"auth failed for {api_key} / {hf_token}")
    except RuntimeError:
        logger.exception("request failed")
    logger.error("nested", exc_info=ValueError(f"bad token {hf_token}"))
    _flush()

    assert handle.file is not None
    text = handle.file.read_text()
    console = capsys.readouterr().err
    for out in (text, console):
        assert "sk-live-0123456789" not in out
        assert hf_token not in out
    assert "using key *** and token *** with backend jax" in text
    assert "RuntimeError: auth failed for *** / ***" in text
    assert "ValueError: bad token ***" in text
    assert "RuntimeError: auth failed for *** / ***" in console


def test_console_shows_warning_and_above(
    make: Callable[..., LogHandle], logger: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    handle = make(level="DEBUG", console=True)
    logger.debug("debug-line")
    logger.info("info-line")
    logger.warning("warning-line")
    _flush()
    err = capsys.readouterr().err
    assert "warning-line" in err
    assert "info-line" not in err
    assert "debug-line" not in err
    assert handle.file is not None
    text = handle.file.read_text()
    assert "debug-line" in text
    assert "info-line" in text


def test_console_follows_a_higher_level(
    make: Callable[..., LogHandle], logger: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    make(level="ERROR", console=True)
    logger.warning("warning-line")
    logger.error("error-line")
    err = capsys.readouterr().err
    assert "warning-line" not in err
    assert "error-line" in err


def test_configure_twice_does_not_duplicate(
    make: Callable[..., LogHandle], logger: logging.Logger, tmp_path: Path
) -> None:
    first = make(console=True)
    second = make(console=True)
    assert first.file == second.file
    assert len(_our_handlers()) == 2  # one file handler, one console handler
    logger.warning("once")
    _flush()
    assert first.file is not None
    assert first.file.read_text().count("once") == 1

    first.close()
    assert first.closed
    assert first.handlers == ()
    logger.warning("still logged")
    _flush()
    assert "still logged" in first.file.read_text()
    assert len(_our_handlers()) == 2

    second.close()
    assert _our_handlers() == []
    logger.warning("after close")
    assert "after close" not in first.file.read_text()


def test_close_removes_handlers_and_restores_logger(make: Callable[..., LogHandle]) -> None:
    root = logging.getLogger("skyward")
    before = (root.level, root.propagate, _our_handlers())
    handle = make(level="DEBUG", console=True)
    assert root.propagate is False
    assert root.level == logging.DEBUG
    added = handle.handlers
    assert len(added) == 2
    assert all(h in root.handlers for h in added)
    assert all(any(isinstance(f, secrets.RedactingFilter) for f in h.filters) for h in added)
    handle.close()
    handle.close()  # idempotent
    assert (root.level, root.propagate, _our_handlers()) == before


def test_two_files_and_levels(
    make: Callable[..., LogHandle], logger: logging.Logger, tmp_path: Path
) -> None:
    quiet = make(file=str(tmp_path / "a.log"), level="WARNING")
    chatty = make(file=str(tmp_path / "b.log"), level="DEBUG")
    logger.debug("dbg")
    logger.warning("warn")
    _flush()
    assert quiet.file is not None
    assert chatty.file is not None
    assert "dbg" not in quiet.file.read_text()
    assert "warn" in quiet.file.read_text()
    assert "dbg" in chatty.file.read_text()
    chatty.close()
    # The most verbose open configuration sets the logger level.
    assert logging.getLogger("skyward").level == logging.WARNING


def test_context_manager(make: Callable[..., LogHandle]) -> None:
    with make() as handle:
        assert len(_our_handlers()) == 1
    assert handle.closed
    assert _our_handlers() == []


def test_configure_false_changes_nothing() -> None:
    root = logging.getLogger("skyward")
    before = (root.level, root.propagate, list(root.handlers))
    handle = configure(False)
    assert handle.closed
    assert handle.handlers == ()
    assert (root.level, root.propagate, list(root.handlers)) == before
    handle.close()


def test_configure_true_uses_defaults(make: Callable[..., LogHandle], skyward_home: Path) -> None:
    handle = make(True)
    assert handle.config == LogConfig()
    assert handle.file == (skyward_home / "logs" / "skyward.log").resolve()
    assert len(handle.handlers) == 2


def test_unwritable_default_log_file_does_not_stop_a_pool(tmp_path, monkeypatch) -> None:
    import skyward as sky

    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the logs folder would go")
    monkeypatch.setenv("SKYWARD_HOME", str(blocker))
    with sky.Compute(nodes=1, options=sky.Options(console="silent")) as pool:
        assert sky.function(lambda: 1)() >> pool == 1
    # ...but an explicit file that cannot be written is an error.
    explicit = sky.Options(logging=sky.LogConfig(file=str(blocker / "x.log")))
    with pytest.raises(sky.ConfigError), sky.Compute(nodes=1, options=explicit):
        pass
