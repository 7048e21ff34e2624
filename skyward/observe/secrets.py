"""Secret values and redaction of them from everything skyward logs or relays.

A value becomes secret in one of two ways:

* explicitly, ``sky.secret("hf_...")`` (a :class:`Secret`, a ``str`` that hides itself in
  ``repr()``), e.g. ``Image(env={"API_KEY": sky.secret(key)})``;
* by convention, when it is the value of an environment variable whose name says it is
  secret (:func:`is_secret_name`), registered through :func:`register_env`.

Either way the value lands in one process-wide registry, and :func:`redact` replaces every
occurrence of every registered value with ``***``. :class:`RedactingFilter` applies that to
log records; the pool applies it to each line of task output it relays.

Some secrets are known by their shape and need no registering: the credentials in a URL's
userinfo (``https://user:token@host/simple``, a package index) are always masked by
:func:`redact` (:func:`mask_url`). What is kept rather than shown -- records, the trail, a
stack's description -- goes through :func:`scrub` (every string of a JSON-like value, JSON text
inside strings too, and the keys of a ``sky.Storage`` description), and a script's own
arguments through :func:`mask_argv`. A value that must stay comparable without being kept is
kept as its :func:`fingerprint`.

Values shorter than :data:`MIN_LENGTH` characters are never registered: redacting ``"a"``
or ``"1"`` would star out half of every log line while protecting nothing (a secret that
short can be guessed anyway).
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from skyward.errors import ConfigError

__all__ = [
    "MASK",
    "MIN_LENGTH",
    "RedactingFilter",
    "Secret",
    "fingerprint",
    "has_credentials",
    "is_secret_name",
    "mask_argv",
    "mask_url",
    "redact",
    "register",
    "register_env",
    "scrub",
    "secret",
]

MASK = "***"
MIN_LENGTH = 4


class Secret(str):
    """A string whose value must not show up in logs, reprs or relayed output.

    It is a real ``str``: it compares, hashes, formats, concatenates and serialises (JSON,
    environment variables) exactly like its value, so it can stand anywhere a string is
    expected. Only ``repr()`` differs: ``Secret('***')``, so that dataclass reprs, tracebacks
    of locals and debug prints of a spec do not print it. Creating one registers its value
    for redaction (see :func:`register` for the minimum length). Pickling round-trips to a
    ``Secret`` and so registers it again in the unpickling process.
    """

    __slots__ = ()

    def __new__(cls, value: str) -> Secret:
        if not isinstance(value, str):
            raise ConfigError(
                f"secret value of type {type(value).__name__} is not valid: secrets are strings. "
                f"Convert it first, e.g. sky.secret(str(value))."
            )
        self = super().__new__(cls, value)
        register(value)
        return self

    def __repr__(self) -> str:
        return f"Secret({MASK!r})"


def secret(value: str) -> Secret:
    """Mark ``value`` as secret: it is redacted from logs and task output from now on."""
    if isinstance(value, Secret):
        return value
    return Secret(value)


class _Snapshot:
    """The registry's immutable state; replaced whole so that redact() needs no lock."""

    __slots__ = ("pattern", "values")

    def __init__(self, values: frozenset[str]) -> None:
        # Longest first: where two values overlap at one position, the longer one matches.
        self.values: tuple[str, ...] = tuple(sorted(values, key=lambda v: (-len(v), v)))
        self.pattern: re.Pattern[str] | None = (
            re.compile("|".join(re.escape(v) for v in self.values)) if self.values else None
        )


class _Registry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: set[str] = set()
        self.snapshot = _Snapshot(frozenset())

    def add(self, value: str) -> None:
        with self._lock:
            if value in self._values:
                return
            self._values.add(value)
            self.snapshot = _Snapshot(frozenset(self._values))


_REGISTRY = _Registry()


def register(value: str) -> None:
    """Redact ``value`` from everything logged or relayed in this process from now on.

    Values shorter than :data:`MIN_LENGTH` (4) characters are ignored: redacting them would
    mangle unrelated text and they are too short to be worth hiding.
    """
    if not isinstance(value, str):
        raise ConfigError(
            f"secret value of type {type(value).__name__} is not valid: only strings can be "
            f"registered for redaction. Convert it first, e.g. register(str(value))."
        )
    if len(value) < MIN_LENGTH:
        return
    _REGISTRY.add(str(value))


def redact(text: str) -> str:
    """``text`` with every registered secret value replaced by ``***``, and the credentials
    of every URL in it too (:func:`mask_url`).

    Called on every line of task output, so the common cases are cheap: an empty registry
    and no ``://`` return at once, and a line with no secret costs one regex scan. Where
    occurrences of different secrets overlap, the union of what they cover is masked, so no
    fragment of either is left.
    """
    if "://" in text:
        text = mask_url(text)
    snap = _REGISTRY.snapshot
    if snap.pattern is None or snap.pattern.search(text) is None:
        return text
    # Rare path: collect every occurrence of every value (overlapping ones included), merge
    # the spans, and mask each merged span once.
    spans: list[tuple[int, int]] = []
    for value in snap.values:
        start = text.find(value)
        while start != -1:
            spans.append((start, start + len(value)))
            start = text.find(value, start + 1)
    spans.sort()
    out: list[str] = []
    pos = 0
    cur_start, cur_end = spans[0]
    for s, e in spans[1:]:
        if s <= cur_end:
            cur_end = max(cur_end, e)
            continue
        out += (text[pos:cur_start], MASK)
        pos = cur_end
        cur_start, cur_end = s, e
    out += (text[pos:cur_start], MASK, text[cur_end:])
    return "".join(out)


# -- secrets known by their shape -----------------------------------------------------------------
# A URL's userinfo: scheme "://" then everything up to the first "@" before the host (no "/",
# "?", "#" or blank on the way, as RFC 3986 wants a literal "@" or "/" in a password encoded).
_USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)([^/?#\s@]+)@")


def mask_url(text: str) -> str:
    """``text`` with the userinfo of every URL in it (``user:password@``, or a token alone)
    replaced by ``***``: ``https://alice:s3cr3t@pkgs.example.com/simple`` becomes
    ``https://***@pkgs.example.com/simple``. The user name goes too: for many indexes it is the
    token itself (``https://TOKEN@host``)."""
    return _USERINFO.sub(lambda m: f"{m.group(1)}{MASK}@", text)


def has_credentials(text: str) -> bool:
    """Whether ``text`` holds a URL with credentials that are not masked yet."""
    return any(m.group(2) != MASK for m in _USERINFO.finditer(text))


def fingerprint(value: str) -> str:
    """What is kept of a secret that must stay comparable (did it change between two pools?)
    without being kept: ``sha256:`` and 16 hex digits of its SHA-256, which give nothing of a
    credential back."""
    import hashlib  # here: nothing on a pool's way to its first task needs it

    return "sha256:" + hashlib.sha256(value.encode()).hexdigest()[:16]


def _kept_masked(value: str) -> bool:
    return value == MASK or value.startswith("sha256:")


# The credential fields of a sky.Storage as records describe it ({"type": "Storage", ...}): a
# description written before they were masked still shows them as the strings they were.
_STORAGE_KEYS = ("access_key", "secret_key", "session_token")


def scrub(value: Any) -> Any:
    """A JSON-like ``value`` (dicts, lists, strings...) with every secret in it masked, for
    anything kept or shown: :func:`redact` on every string, JSON text inside a string scrubbed
    as JSON (a stack's config holds the pool's description as one string), and the keys of a
    ``sky.Storage`` description masked unless already a fingerprint. A new object; ``value``
    is not changed."""
    if isinstance(value, str):
        stripped = value.lstrip()
        if stripped[:1] in ("{", "["):
            import json

            try:
                parsed = json.loads(value)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict | list):
                cleaned = scrub(parsed)
                return value if cleaned == parsed else json.dumps(cleaned)
        return redact(value)
    if isinstance(value, dict):
        out = {k: scrub(v) for k, v in value.items()}
        if out.get("type") == "Storage":
            for key in _STORAGE_KEYS:
                if isinstance(out.get(key), str) and not _kept_masked(out[key]):
                    out[key] = MASK
        return out
    if isinstance(value, list | tuple):
        return [scrub(v) for v in value]
    return value


def mask_argv(argv: Sequence[str]) -> list[str]:
    """A command line as records and the trail keep it: the value of every option whose name
    is secret by :func:`is_secret_name` (``--api-token X``, ``--password=X``, ``HF_TOKEN=X``),
    URL credentials, registered secrets, and the value of any secret-named variable of this
    process's environment (``train.py $HF_TOKEN``) become ``***``. Everything else is kept:
    it says how the script ran."""
    known = [v for k, v in os.environ.items() if len(v) >= MIN_LENGTH and _secret_by_convention(k, v)]
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        name, eq, value = arg.partition("=")
        option = name.lstrip("-").replace("-", "_")
        if eq and option and value and "://" not in name and is_secret_name(option):
            out.append(f"{name}={MASK}")
            continue
        if not eq and arg.startswith("-") and option and is_secret_name(option):
            hide_next = True  # `--token VALUE`: the value is the next word
            out.append(arg)
            continue
        for v in known:
            arg = arg.replace(v, MASK)
        out.append(redact(arg))
    return out


# The rule for names (compared upper-cased, since env names are conventionally upper case
# but "hf_token" in a .env file means the same thing):
#   the whole name is, or ends with "_" + , one of these words.
# Matching whole underscore-separated words at the end, never substrings, is what keeps
# KEYBOARD_LAYOUT, KERAS_BACKEND, TOKENIZERS_PARALLELISM or MONKEY_PATCH out.
# "KEY" covers API_KEY, ACCESS_KEY, SECRET_ACCESS_KEY, SECRET_KEY, PRIVATE_KEY, ...
_SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "KEY", "APIKEY")
# Secret by well-known name although they fit no word rule. (Not "*_PWD": PWD and OLDPWD are
# the shell's working directory.)
_SECRET_NAMES = frozenset({"PGPASSWORD", "MYSQL_PWD", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN"})
# Ends in _KEY but is public by definition.
_PUBLIC_SUFFIXES = ("_PUBLIC_KEY", "_PUB_KEY")
# Values that a convention-named variable often holds as a switch (HF_HUB_DISABLE_IMPLICIT_TOKEN=
# "true"); registering them would star out every "true" in every log line.
_NOT_SECRET_VALUES = frozenset({"true", "false", "none", "null", "auto"})


def is_secret_name(name: str) -> bool:
    """Whether an environment variable named ``name`` holds a secret by convention.

    The rule, on the upper-cased name: it is one of PGPASSWORD, MYSQL_PWD, HF_TOKEN,
    HUGGING_FACE_HUB_TOKEN, or it equals or ends with ``_`` + one of TOKEN, SECRET, PASSWORD,
    PASSWD, PASSPHRASE, KEY, APIKEY -- unless it ends with _PUBLIC_KEY or _PUB_KEY.
    Only whole trailing words count, so KERAS_BACKEND, KEYBOARD, TOKENIZERS_PARALLELISM and
    AWS_ACCESS_KEY_ID (an identifier, not a secret) are not secret names.

    The rule errs towards secret: a false positive only stars out a harmless value in logs,
    a false negative leaks a credential.
    """
    upper = name.upper()
    if upper in _SECRET_NAMES:
        return True
    if upper.endswith(_PUBLIC_SUFFIXES):
        return False
    return any(upper == w or upper.endswith("_" + w) for w in _SECRET_WORDS)


def register_env(env: Mapping[str, str]) -> None:
    """Register the secret values of an environment mapping.

    A value is registered when it is a :class:`Secret` (always, whatever its name) or when its
    name is secret by :func:`is_secret_name`. For names matched only by convention, values
    that look like switches or numbers (``true``, ``false``, ``none``, ``null``, ``auto``,
    all digits) are skipped: they are settings, not credentials, and masking them would
    mangle unrelated log text. Values shorter than 4 characters are skipped as by
    :func:`register`. Non-string values are ignored (they cannot be env values anyway).
    """
    for name, value in env.items():
        if not isinstance(value, str):
            continue
        if isinstance(value, Secret) or _secret_by_convention(name, value):
            register(value)


def _secret_by_convention(name: str, value: str) -> bool:
    setting = value.strip()
    return (
        is_secret_name(name) and setting.lower() not in _NOT_SECRET_VALUES and not setting.isdigit()
    )


class RedactingFilter(logging.Filter):
    """Masks registered secrets in a record's message, exception and stack text.

    The message is formatted first (``msg % args``), since a secret usually arrives as an
    argument; the record then carries the redacted text with no args. The exception text is
    rendered here and cached on the record (``exc_text``), which every ``logging.Formatter``
    uses instead of rendering the traceback again, so the redacted form is what gets written,
    also by handlers further up that do not have this filter.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:
            # A bad format string would otherwise reach Handler.handleError, which prints the
            # raw args (secrets included) to stderr.
            message = f"{record.msg!s} (log arguments did not fit the format: {record.args!r})"
        record.msg = redact(message)
        record.args = ()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True
