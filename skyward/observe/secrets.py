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
kept as its :func:`fingerprint`, a hash keyed with a key of this machine's ``SKYWARD_HOME``.

Values shorter than :data:`MIN_LENGTH` characters are never registered: redacting ``"a"``
or ``"1"`` would star out half of every log line while protecting nothing (a secret that
short can be guessed anyway).
"""

from __future__ import annotations

import logging
import os
import re
import sys
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
    "fingerprint_matches",
    "has_credentials",
    "is_fingerprint",
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

    __slots__ = ("_pattern", "edges", "values")

    def __init__(self, values: frozenset[str], edges: dict[str, tuple[int, int]] | None = None) -> None:
        # Longest first: where two values overlap at one position, the longer one matches.
        self.values: tuple[str, ...] = tuple(sorted(values, key=lambda v: (-len(v), v)))
        # Characters masked too before and after a form (a base64 run's shared characters).
        self.edges: dict[str, tuple[int, int]] = edges or {}
        self._pattern: re.Pattern[str] | bool | None = False  # False: not compiled yet

    @property
    def pattern(self) -> re.Pattern[str] | None:
        """One regex of every value, compiled when a text is first checked against this
        snapshot: a pool's start registers its secret's forms in turn (each a new snapshot),
        and compiling each alternation cost the start 2 ms apiece. (Two threads may compile it
        at once; either result is the same pattern.)"""
        if self._pattern is False:
            self._pattern = re.compile("|".join(re.escape(v) for v in self.values)) if self.values else None
        assert not isinstance(self._pattern, bool)
        return self._pattern


class _Registry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: set[str] = set()  # what is masked: the values and their encoded forms
        self._given: set[str] = set()  # the values registered
        self._edges: dict[str, tuple[int, int]] = {}
        self.snapshot = _Snapshot(frozenset())

    def add(self, value: str, forms: Mapping[str, tuple[int, int]] | Sequence[str] = ()) -> None:
        """Mask ``value`` and the ``forms`` it takes once encoded (:func:`_encoded_forms`: each
        with the characters before and after it that are masked with it)."""
        with self._lock:
            if value in self._given:
                return
            self._given.add(value)
            self._values.add(value)
            self._values.update(forms)
            if isinstance(forms, Mapping):
                for form, (before, after) in forms.items():
                    had = self._edges.get(form, (0, 0))
                    if (before, after) != (0, 0):
                        self._edges[form] = (max(had[0], before), max(had[1], after))
            self.snapshot = _Snapshot(frozenset(self._values), dict(self._edges))
        _redact_uncaught()


_REGISTRY = _Registry()


# -- uncaught exceptions ----------------------------------------------------------------------
# A task's exception is raised again on the client with its message, its notes and the node's
# traceback (dispatch.decode_result); uncaught, Python's own hook prints all of it on stderr,
# past every logging filter. Once there is a secret to hide, this process's hooks for uncaught
# exceptions (the main thread's and other threads') print the same text redacted. A hook the
# program set itself (IPython, rich) is left alone.
def _redact_uncaught() -> None:
    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = _excepthook
    if threading.excepthook is threading.__excepthook__:
        threading.excepthook = _thread_excepthook


def _excepthook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
    try:
        import traceback

        text = "".join(traceback.format_exception(kind, value, tb))
        if sys.stderr is not None:
            sys.stderr.write(redact(text))
            sys.stderr.flush()
    except Exception:
        sys.__excepthook__(kind, value, tb)


def _thread_excepthook(args: Any) -> None:
    if args.exc_type is SystemExit:
        return
    try:
        import traceback

        name = args.thread.name if args.thread is not None else threading.get_ident()
        text = "".join(traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback))
        if sys.stderr is not None:
            sys.stderr.write(redact(f"Exception in thread {name}:\n{text}"))
            sys.stderr.flush()
    except Exception:
        threading.__excepthook__(args)


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
    _REGISTRY.add(str(value), _encoded_forms(value) if len(value) >= ENCODED_MIN_LENGTH else {})


# Below this length a secret's URL-encoded and base64 forms are not masked: their fragments
# would be short enough to match unrelated text, and a value that short is guessed anyway.
ENCODED_MIN_LENGTH = 8


def _encoded_forms(value: str) -> dict[str, tuple[int, int]]:
    """How ``value`` shows up when something encoded it: URL-encoded (``quote`` and
    ``quote_plus``, as in a query string or an ``OTEL_*_HEADERS`` value) and base64 (standard
    and URL-safe; an ``Authorization: Basic`` header, a JSON blob), each with how many
    characters before and after it are masked with it. Base64 encodes three bytes at a time,
    so the value's encoding depends on where it starts in the encoded input: for each of the
    three offsets, the run of characters made of the value alone is found wherever the value
    was encoded as part of something longer (``user:password``), and the character at either
    end that holds bits of the value and bits of its neighbour goes with it, so that nothing
    of the value shows, not even the last digits of a short password."""
    import base64
    from urllib.parse import quote, quote_plus

    raw = value.encode()
    forms = dict.fromkeys((quote(value, safe=""), quote(value), quote_plus(value)), (0, 0))
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + raw).decode()
        left = (shift + len(raw)) % 3  # the value's bytes in its last group, with what follows
        # A last group's first `left` characters are the value's; the next one is shared.
        end = 4 * ((shift + len(raw)) // 3) + left
        run = encoded[(0, 2, 3)[shift]:end]
        edges = (1 if shift else 0, 1 if left else 0)  # the first group's is shared when shifted
        forms[run] = forms[run.replace("+", "-").replace("/", "_")] = edges
    forms.pop(value, None)
    return {f: e for f, e in forms.items() if len(f) >= ENCODED_MIN_LENGTH}


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
        before, after = snap.edges.get(value, (0, 0))
        start = text.find(value)
        while start != -1:
            spans.append((max(0, start - before), min(len(text), start + len(value) + after)))
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
# A URL's userinfo: scheme "://" then everything up to the LAST "@" before the host (no "/",
# "?", "#" or blank on the way). RFC 3986 wants an "@" in a password encoded, but clients (curl,
# pip, requests) read ``https://u:p@ss@host`` as user "u", password "p@ss": the greedy run
# masks all of it, not "u:p" alone.
# Quotes and angle brackets are never in a URL: they end one (JSON, HTML, a quoted word).
_USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)([^/?#\s\"'<>`\\]+)@")


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
    without being kept: ``hmac:`` and 16 hex digits of its HMAC-SHA256 under this machine's
    fingerprint key (:func:`fingerprint_key`). A plain hash of a short or guessable secret (an
    8-digit PIN, a dictionary password) is reversed by trying every candidate; without the key,
    which never leaves ``SKYWARD_HOME``, a record or a stack's description gives nothing back.
    Two records made under the same ``SKYWARD_HOME`` compare as before."""
    import hashlib  # here: nothing on a pool's way to its first task needs them
    import hmac

    return "hmac:" + hmac.new(fingerprint_key(), value.encode(), hashlib.sha256).hexdigest()[:16]


def fingerprint_matches(value: str, kept: str) -> bool:
    """Whether ``kept``, a fingerprint from a record, is that of ``value``: keyed (``hmac:``), or
    a plain ``sha256:`` one from a record written before fingerprints were keyed."""
    if kept.startswith(_LEGACY):
        import hashlib

        return kept == _LEGACY + hashlib.sha256(value.encode()).hexdigest()[:16]
    return kept == fingerprint(value)


def is_fingerprint(text: str) -> bool:
    """Whether ``text`` is a fingerprint as records keep them (keyed, or the older plain ones)."""
    return text.startswith(("hmac:", _LEGACY))


_LEGACY = "sha256:"
_KEYS: dict[str, bytes] = {}


def fingerprint_key() -> bytes:
    """This machine's key for :func:`fingerprint`: 32 random bytes in
    ``SKYWARD_HOME/fingerprint.key`` (0600), made the first time one is needed. Where the home
    cannot be written, a key for this process alone (its fingerprints then compare with no
    other process's, which hides more, not less)."""
    from ..paths import private_home

    try:
        home = private_home()
    except OSError:
        home = None
    slot = str(home)
    key = _KEYS.get(slot)
    if key is not None:
        return key
    key = os.urandom(32)
    if home is not None:
        key = _kept_key(home / "fingerprint.key", key)
    _KEYS[slot] = key
    return key


def _kept_key(path: Any, key: bytes) -> bytes:
    """The key in ``path``, or ``key`` written there first: complete (written aside, then linked
    in place, which fails if another process was first) and 0600."""
    try:
        kept = path.read_bytes()
    except OSError:
        kept = b""
    if len(kept) == 32:
        return kept
    aside = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    try:
        fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key)
        try:
            os.link(aside, path)
        except FileExistsError:
            kept = path.read_bytes()
            if len(kept) == 32:
                key = kept
    except OSError:
        pass  # a key for this process alone
    finally:
        try:
            os.unlink(aside)
        except OSError:
            pass
    return key


def _kept_masked(value: str) -> bool:
    return value == MASK or is_fingerprint(value)


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
# The OpenTelemetry exporter's headers ("api-key=VALUE,Authorization=Bearer%20VALUE"): secret as
# a whole, and each header's value alone too (register_env), URL-encoded as the spec has them.
_OTLP_HEADERS = re.compile(r"OTEL_EXPORTER_OTLP(?:_TRACES|_METRICS|_LOGS)?_HEADERS")
# Words that name a credential whatever it looks like: a password of digits is still a password.
_PASSWORD_WORDS = ("PASSWORD", "PASSWD", "PASSPHRASE", "SECRET", "PGPASSWORD", "MYSQL_PWD")
# From this many digits a value of a secret-named variable is a credential (a PIN, an account
# key), not a setting such as API_KEY_INDEX=2 or MAX_TOKEN=1024.
_DIGITS_SECRET = 6


def is_secret_name(name: str) -> bool:
    """Whether an environment variable named ``name`` holds a secret by convention.

    The rule, on the upper-cased name: it is one of PGPASSWORD, MYSQL_PWD, HF_TOKEN,
    HUGGING_FACE_HUB_TOKEN, OTEL_EXPORTER_OTLP_HEADERS (or its ``_TRACES_``, ``_METRICS_``,
    ``_LOGS_`` forms: they carry the exporter's API key), or it equals or ends with ``_`` + one of TOKEN, SECRET, PASSWORD,
    PASSWD, PASSPHRASE, KEY, APIKEY -- unless it ends with _PUBLIC_KEY or _PUB_KEY.
    Only whole trailing words count, so KERAS_BACKEND, KEYBOARD, TOKENIZERS_PARALLELISM and
    AWS_ACCESS_KEY_ID (an identifier, not a secret) are not secret names.

    The rule errs towards secret: a false positive only stars out a harmless value in logs,
    a false negative leaks a credential.
    """
    upper = name.upper()
    if upper in _SECRET_NAMES or _OTLP_HEADERS.fullmatch(upper):
        return True
    if upper.endswith(_PUBLIC_SUFFIXES):
        return False
    return any(upper == w or upper.endswith("_" + w) for w in _SECRET_WORDS)


def register_env(env: Mapping[str, str]) -> None:
    """Register the secret values of an environment mapping.

    A value is registered when it is a :class:`Secret` (always, whatever its name) or when its
    name is secret by :func:`is_secret_name`. For names matched only by convention, values
    that look like switches (``true``, ``false``, ``none``, ``null``, ``auto``) or short
    numbers (fewer than 6 digits) are skipped: they are settings, not credentials, and masking
    them would mangle unrelated log text. A number is always a credential for a password-like
    name (``*PASSWORD``, ``*PASSWD``, ``*PASSPHRASE``, ``*SECRET``, ``MYSQL_PWD``). Each header
    value of ``OTEL_EXPORTER_OTLP_*HEADERS`` is registered on its own too. Values shorter than 4 characters are skipped as by
    :func:`register`. Non-string values are ignored (they cannot be env values anyway).
    """
    for name, value in env.items():
        if not isinstance(value, str):
            continue
        if isinstance(value, Secret) or _secret_by_convention(name, value):
            register(value)
            if _OTLP_HEADERS.fullmatch(name.upper()):
                for header in _header_values(value):
                    register(header)


def _header_values(value: str) -> list[str]:
    """The values of ``key=value,key=value`` (OTEL_EXPORTER_OTLP_HEADERS), as given and
    URL-decoded, with ``Bearer``/``Basic`` schemes' credentials on their own."""
    from urllib.parse import unquote

    out: list[str] = []
    for item in value.split(","):
        _, eq, given = item.partition("=")
        if not eq:
            continue
        for form in {given.strip(), unquote(given).strip()}:
            out.append(form)
            scheme, blank, credential = form.partition(" ")
            if blank and scheme.lower() in ("bearer", "basic", "token", "apikey"):
                out.append(credential.strip())
    return out


def _secret_by_convention(name: str, value: str) -> bool:
    setting = value.strip()
    if not is_secret_name(name) or setting.lower() in _NOT_SECRET_VALUES:
        return False
    if setting.isdigit():  # a number is a setting, unless the name or its length says credential
        upper = name.upper()
        return upper.endswith(_PASSWORD_WORDS) or len(setting) >= _DIGITS_SECRET
    return True


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
