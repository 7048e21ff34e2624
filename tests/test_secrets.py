from __future__ import annotations

import json
import logging
import pickle
import sys
import time

import pytest

import skyward.observe.secrets as secrets
from skyward.errors import ConfigError
from skyward.observe.secrets import (
    RedactingFilter,
    Secret,
    is_secret_name,
    redact,
    register,
    secret,
)


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with an empty registry; the process-wide one is put back after."""
    monkeypatch.setattr(secrets, "_REGISTRY", secrets._Registry())


def test_secret_is_a_str_with_a_masked_repr() -> None:
    s = secret("abc-123-xyz")
    assert isinstance(s, str)
    assert isinstance(s, Secret)
    assert s == "abc-123-xyz"
    assert hash(s) == hash("abc-123-xyz")
    assert repr(s) == "Secret('***')"
    assert "abc" not in repr({"API_KEY": s})
    assert str(s) == "abc-123-xyz"
    assert f"{s}" == "abc-123-xyz"
    assert s + "!" == "abc-123-xyz!"
    assert json.dumps({"k": s}) == '{"k": "abc-123-xyz"}'
    assert secret(s) is s


def test_creating_a_secret_registers_it() -> None:
    secret("hunter2-password")
    assert redact("login with hunter2-password now") == "login with *** now"


def test_secret_pickles_and_stays_secret() -> None:
    s = secret("pickled-value")
    back = pickle.loads(pickle.dumps(s))
    assert back == "pickled-value"
    assert isinstance(back, str)
    assert repr(back) == "Secret('***')"


def test_secret_of_a_non_string_is_refused() -> None:
    with pytest.raises(ConfigError, match="int"):
        secret(1234)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="bytes"):
        register(b"abcd")  # type: ignore[arg-type]


def test_short_values_are_not_registered() -> None:
    register("abc")
    s = secret("xy")
    assert repr(s) == "Secret('***')"
    assert redact("abc xy abcd") == "abc xy abcd"
    register("abcd")
    assert redact("abc xy abcd") == "abc xy ***"


def test_redact_replaces_every_occurrence() -> None:
    register("tok1")
    assert redact("tok1 and tok1tok1") == "*** and ***"


def test_redact_longest_first_and_overlaps() -> None:
    register("abc123")
    register("abc1234")
    assert redact("key=abc1234;") == "key=***;"
    assert redact("key=abc123;") == "key=***;"
    # Overlapping different values: the union of what they cover is masked, nothing leaks.
    register("xxab")
    register("abyy")
    assert redact("[xxabyy]") == "[***]"


def test_redact_handles_regex_metacharacters() -> None:
    register("a.b*c+(d)")
    assert redact("x a.b*c+(d) aXbbc") == "x *** aXbbc"


def test_redact_with_empty_registry_is_a_fast_no_op() -> None:
    text = "an ordinary line of task output\n"
    assert redact(text) is text
    start = time.perf_counter()
    for _ in range(100_000):
        redact(text)
    # Generous bound: the empty path is one attribute read and a None check.
    assert time.perf_counter() - start < 0.5


def test_redact_line_without_secret_returns_it_unchanged() -> None:
    register("some-secret")
    text = "nothing to see here"
    assert redact(text) is text


@pytest.mark.parametrize(
    "name",
    [
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "GITHUB_TOKEN",
        "AWS_SESSION_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "WANDB_API_KEY",
        "OPENAI_API_KEY",
        "MY_ACCESS_KEY",
        "DJANGO_SECRET_KEY",
        "SSH_PRIVATE_KEY",
        "CLIENT_SECRET",
        "DB_PASSWORD",
        "PULUMI_CONFIG_PASSPHRASE",
        "ENCRYPTION_KEY",
        "STRIPE_APIKEY",
        "PGPASSWORD",
        "MYSQL_PWD",
        "TOKEN",
        "PASSWORD",
        "hf_token",
    ],
)
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "KERAS_BACKEND",
        "KEYBOARD",
        "TOKENIZERS_PARALLELISM",
        "AWS_ACCESS_KEY_ID",
        "AWS_REGION",
        "PWD",
        "OLDPWD",
        "PATH",
        "HF_HOME",
        "MONKEY",
        "SSH_PUBLIC_KEY",
        "GPG_PUB_KEY",
        "CUDA_VISIBLE_DEVICES",
        "SECRETS_DIR",
        "PASSWORD_FILE",
    ],
)
def test_not_secret_names(name: str) -> None:
    assert not is_secret_name(name)


def test_register_env() -> None:
    secrets.register_env(
        {
            "HF_TOKEN": "hf_abcdefgh",
            "KERAS_BACKEND": "torch",
            "CUSTOM": Secret("custom-value"),
            "HF_HUB_DISABLE_IMPLICIT_TOKEN": "true",
            "MAX_TOKEN": "4096",
            "SHORT_TOKEN": "abc",
        }
    )
    line = "hf_abcdefgh torch custom-value true 4096 abc"
    assert redact(line) == "*** torch *** true 4096 abc"


def _record(msg: str, *args: object, exc: bool = False) -> logging.LogRecord:
    exc_info = sys.exc_info() if exc else None
    return logging.LogRecord("skyward.test", logging.INFO, __file__, 1, msg, args, exc_info)


def test_redacting_filter_formats_then_redacts() -> None:
    register("sekrit-value")
    record = _record("token is %s (%d)", "sekrit-value", 3)
    assert RedactingFilter().filter(record)
    assert record.msg == "token is *** (3)"
    assert record.args == ()
    assert record.getMessage() == "token is *** (3)"


def test_redacting_filter_redacts_exception_text() -> None:
    register("sekrit-value")
    try:
        raise RuntimeError("failed with sekrit-value")
    except RuntimeError:
        record = _record("boom", exc=True)
    RedactingFilter().filter(record)
    assert record.exc_text is not None
    assert "RuntimeError: failed with ***" in record.exc_text
    formatted = logging.Formatter().format(record)
    assert "sekrit-value" not in formatted


def test_redacting_filter_survives_bad_format_args() -> None:
    register("sekrit-value")
    record = _record("no placeholders", "sekrit-value")
    assert RedactingFilter().filter(record)
    assert "sekrit-value" not in record.getMessage()
    assert "no placeholders" in record.getMessage()
