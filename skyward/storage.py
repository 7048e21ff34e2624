"""Object storage: ``sky.Storage`` (an S3-compatible client) and the presets in ``sky.storage``.

    with sky.storage.S3(region="us-east-1") as s3:
        s3.upload("my-bucket", "model.pt", key="checkpoints/model.pt")
        print(s3.ls("my-bucket", prefix="checkpoints/"))
        s3.download("my-bucket", "checkpoints/model.pt", "restored.pt")

The transfers go through obstore (the Rust ``object_store`` crate behind a small Python API;
the ``skyward[storage]`` extra): large files go up as a multipart upload and come down as
ranged reads, both several parts at a time, with a progress bar on a terminal for long ones.
A ``Storage`` is also what ``sky.Volume(storage=...)`` mounts on the nodes (see volumes.py).

Credentials are a string, or a callable returning one (plain or ``async``), resolved when a
transfer needs them (and again every few minutes, so rotating secrets keep working). The
presets read what is not given from the provider's usual environment variables (``ENV_VARS``),
by name: the value is read when a transfer needs it, so it never travels in a pickle or a
record. Keys given as strings are secrets of this process from the moment the Storage is made
(redacted from logs, output and errors), and records and stacks keep them only as a
fingerprint (:meth:`Storage.record_view`); a reproduction reads them again from the variables
:func:`key_variables` names. ``S3()`` without keys and without ``AWS_ACCESS_KEY_ID`` uses the AWS credential chain:
web identity, the container or instance role, and ``~/.aws`` profiles when boto3 is installed.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import re
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeAlias

from .errors import ConfigError, StorageError
from .observe import secrets

Credential: TypeAlias = str | Callable[[], str | Awaitable[str]]

_PART = 32 << 20  # bytes per part of a multipart upload or a ranged download
_CONCURRENCY = 8  # parts in flight at once
_PROGRESS_FROM = 64 << 20  # show a progress bar for transfers at least this large (on a terminal)

__all__ = ["GCS", "R2", "S3", "Backblaze", "Credential", "Hyperstack", "Storage", "Wasabi"]


@dataclass(frozen=True, slots=True)
class Storage:
    """An S3-compatible object store at ``endpoint``; use it as a context manager.

    ``access_key``/``secret_key``: strings or callables returning one (sync or async); None for
    both uses the endpoint's ambient credentials (the AWS chain for S3). ``path_style``:
    address buckets as ``endpoint/bucket`` instead of ``bucket.endpoint`` (local servers,
    MinIO). ``region``: the signing region (default: read from an AWS endpoint, else
    ``us-east-1``). ``provider``: the vendor name rclone uses when a Volume mounts this store.
    ``session_token``: the token of temporary keys (AWS STS), with the two keys.
    """

    endpoint: str
    access_key: Credential | None = None
    secret_key: Credential | None = None
    path_style: bool = False
    region: str | None = None
    provider: str = "Other"
    session_token: Credential | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.endpoint, str) or not re.match(r"^https?://[^/\s]+", self.endpoint):
            raise ConfigError(
                f"Storage(endpoint={self.endpoint!r}) is not valid: an http(s) URL such as "
                f"'https://s3.us-east-1.amazonaws.com' or 'http://127.0.0.1:9000'."
            )
        object.__setattr__(self, "endpoint", self.endpoint.rstrip("/"))
        if (self.access_key is None) != (self.secret_key is None):
            raise ConfigError(
                "Storage(access_key=..., secret_key=...): give both keys, or neither to use the "
                "ambient credentials (for S3: the AWS credential chain)."
            )
        if self.session_token is not None and self.access_key is None:
            raise ConfigError(
                "Storage(session_token=...) goes with access_key= and secret_key= (temporary keys); "
                "give all three, or none to use the ambient credentials."
            )
        for name in ("access_key", "secret_key", "session_token"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str) and not callable(value):
                raise ConfigError(
                    f"Storage({name}=...) is a {type(value).__name__}: use a string, or a function "
                    f"returning one (it may be async), e.g. {name}=lambda: os.environ['MY_KEY']."
                )
            if isinstance(value, str):
                secrets.register(value)  # never in a log line, a task's output or an error from now on

    def __repr__(self) -> str:  # never the keys
        keyed = "keys" if self.access_key is not None else "ambient credentials"
        return f"Storage({self.endpoint!r}, {keyed}, path_style={self.path_style})"

    def record_view(self) -> dict[str, Any]:
        """What a record or a stack's description keeps of this store: everything but the keys,
        each of which is kept as its fingerprint (a string key), its variable's name (FromEnv)
        or its function's name, so that two pools' keys can be told apart and none is kept."""
        out: dict[str, Any] = {"type": "Storage", "endpoint": self.endpoint, "path_style": self.path_style,
                               "region": self.region, "provider": self.provider}
        for name in KEYS:
            value = getattr(self, name)
            if isinstance(value, str):
                out[name] = secrets.fingerprint(value)
            elif isinstance(value, FromEnv):
                out[name] = {"type": "FromEnv", "name": value.name, "preset": value.preset, "argument": value.argument}
            else:
                out[name] = None if value is None else getattr(value, "__qualname__", type(value).__name__)
        return out

    def unkeyed(self) -> Storage:
        """This store with each key given as a string replaced by a FromEnv of the variable a
        reproduction reads it from (:func:`key_variables`): what a record's rebuild blob pickles.
        Keys read from the environment or by a function stay as they are (no value in them)."""
        names = key_variables(self)
        changes: dict[str, Any] = {name: FromEnv(names[name], "Storage", name) for name in KEYS
                                   if isinstance(getattr(self, name), str)}
        return replace(self, **changes) if changes else self

    # -- context manager: nothing to open; the connections close with the last reference ----
    def __enter__(self) -> Storage:
        _client_module()
        return self

    def __exit__(self, *exc: object) -> None:
        _STORES.pop(self, None)

    @property
    def signing_region(self) -> str:
        if self.region:
            return self.region
        m = re.match(r"^https?://s3[.-]([a-z0-9-]+)\.amazonaws\.com", self.endpoint)
        return m.group(1) if m and m.group(1) != "external-1" else "us-east-1"

    def credentials(self) -> tuple[str, str] | None:
        """The (access key, secret key) now, callables called; None for ambient credentials."""
        if self.access_key is None or self.secret_key is None:
            return None
        return _resolve(self.access_key, "access_key"), _resolve(self.secret_key, "secret_key")

    def token(self) -> str | None:
        """The session token now (temporary keys), or None."""
        return None if self.session_token is None else _resolve(self.session_token, "session_token")

    # -- the five operations ----------------------------------------------------------------
    def upload(self, bucket: str, local_path: str | os.PathLike[str], *, key: str | None = None) -> str:
        """Upload a file (or every file under a folder) and return the key (or the prefix).

        ``key`` defaults to the file's name; for a folder it is the prefix its files go under
        (default: the folder's name)."""
        obs = _client_module()
        src = Path(local_path).expanduser()
        if src.is_dir():
            prefix = (key if key is not None else src.name).strip("/")
            for path in sorted(p for p in src.rglob("*") if p.is_file()):
                rel = path.relative_to(src).as_posix()
                self.upload(bucket, path, key=f"{prefix}/{rel}" if prefix else rel)
            return prefix
        if not src.is_file():
            raise StorageError(f"upload to bucket {bucket!r}: {str(src)!r} is not a file or folder on this machine.")
        name = key if key is not None else src.name
        size = src.stat().st_size
        store = self._store(bucket)
        with _progress(f"upload {name}", size) as advance:
            try:
                obs.put(store, name, _chunks(src, advance), chunk_size=_PART, max_concurrency=_CONCURRENCY)
            except Exception as exc:
                raise self._error("upload", bucket, name, exc) from None
        return name

    def download(self, bucket: str, key: str, local_path: str | os.PathLike[str]) -> Path:
        """Download one object to ``local_path`` (into it, under the key's name, when it is a
        folder); return the file written. The file appears whole or not at all."""
        obs = _client_module()
        dest = Path(local_path).expanduser()
        if dest.is_dir():
            dest = dest / key.rsplit("/", 1)[-1]
        dest.parent.mkdir(parents=True, exist_ok=True)
        store = self._store(bucket)
        try:
            size = int(obs.head(store, key)["size"])
        except Exception as exc:
            raise self._error("download", bucket, key, exc) from None
        tmp = dest.with_name(f".{dest.name}.skyward-part")
        try:
            with open(tmp, "wb") as f, _progress(f"download {key}", size) as advance:
                if size <= _PART:
                    for chunk in obs.get(store, key).stream(min_chunk_size=8 << 20):
                        f.write(chunk)
                        advance(len(chunk))
                else:
                    f.truncate(size)
                    _run(_ranged_download(obs, store, key, size, f.fileno(), advance))
            tmp.replace(dest)
        except BaseException as exc:
            tmp.unlink(missing_ok=True)
            if isinstance(exc, Exception) and not isinstance(exc, StorageError | OSError):
                raise self._error("download", bucket, key, exc) from None
            raise
        return dest

    def ls(self, bucket: str, prefix: str = "") -> list[str]:
        """The keys in ``bucket`` that start with ``prefix`` (a folder-like prefix such as
        ``"data/"`` or any leading part of a key), sorted."""
        obs = _client_module()
        store = self._store(bucket)
        # object_store lists by path segments: list the folder part, filter the rest here.
        folder = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        try:
            keys = [m["path"] for batch in obs.list(store, folder or None, chunk_size=1000) for m in batch]
        except Exception as exc:
            raise self._error("ls", bucket, prefix, exc) from None
        return sorted(k for k in keys if k.startswith(prefix))

    def exists(self, bucket: str, key: str) -> bool:
        """Whether the object ``key`` is in ``bucket`` (a missing bucket is an error)."""
        obs = _client_module()
        store = self._store(bucket)
        try:
            obs.head(store, key)
            return True
        except FileNotFoundError:
            self._check_bucket(bucket, key, "exists")
            return False
        except Exception as exc:
            raise self._error("exists", bucket, key, exc) from None

    def rm(self, bucket: str, key: str) -> None:
        """Delete the object ``key`` (deleting a missing key is not an error, as in S3)."""
        obs = _client_module()
        store = self._store(bucket)
        try:
            obs.delete(store, key)
        except FileNotFoundError:
            return
        except Exception as exc:
            raise self._error("rm", bucket, key, exc) from None

    # -- internals ---------------------------------------------------------------------------
    def _store(self, bucket: str) -> Any:
        if not bucket or "/" in bucket:
            raise ConfigError(f"bucket={bucket!r} is not valid: a bucket name, without slashes (put paths in the key).")
        cache = _STORES.setdefault(self, {})
        store = cache.get(bucket)
        if store is None:
            from obstore.store import S3Store

            provider: Any = self._credential_provider()
            store = S3Store(
                bucket,
                endpoint=self.endpoint,
                region=self.signing_region,
                virtual_hosted_style_request=not self.path_style,
                client_options={"allow_http": self.endpoint.startswith("http://"), "timeout": "300s",
                                "connect_timeout": "10s"},
                retry_config={"max_retries": 3, "backoff": {"init_backoff": timedelta(milliseconds=200),
                                                            "max_backoff": timedelta(seconds=5), "base": 2},
                              "retry_timeout": timedelta(minutes=3)},
                credential_provider=provider,
            )
            cache[bucket] = store
        return store

    def _credential_provider(self) -> Callable[[], dict[str, Any]] | None:
        if self.access_key is not None:
            static = all(isinstance(v, str | None) for v in (self.access_key, self.secret_key, self.session_token))

            def provide() -> dict[str, Any]:
                keys = self.credentials()
                assert keys is not None
                # Callables are asked again after a while: rotated secrets keep working.
                expires = None if static else datetime.now(UTC) + timedelta(minutes=5)
                return {"access_key_id": keys[0], "secret_access_key": keys[1], "token": self.token(),
                        "expires_at": expires}

            return provide
        try:  # the full AWS chain (profiles, SSO, ~/.aws/credentials) when boto3 is here
            import boto3
            from obstore.auth.boto3 import Boto3CredentialProvider

            session = boto3.Session()
            if session.get_credentials() is not None:
                return Boto3CredentialProvider(session)  # type: ignore[return-value]
        except Exception:
            pass
        return None  # object_store's own chain: environment, web identity, ECS, instance role

    def _check_bucket(self, bucket: str, key: str, op: str) -> None:
        """A missing object: make sure it is not a missing bucket (S3 says 404 for both)."""
        obs = _client_module()
        try:
            next(iter(obs.list(self._store(bucket), None, chunk_size=1)), None)
        except Exception as exc:
            raise self._error(op, bucket, key, exc) from None

    def _error(self, op: str, bucket: str, key: str, exc: BaseException) -> StorageError:
        text = str(exc)
        low = text.lower()
        if "nosuchbucket" in low or "bucket does not exist" in low or "specified bucket" in low:
            why = f"the bucket {bucket!r} does not exist at {self.endpoint}: check its name, or create it"
        elif isinstance(exc, FileNotFoundError) or "not found" in low or "nosuchkey" in low:
            why = f"no object {key!r} in bucket {bucket!r}: check the key (`ls(bucket, prefix)` lists them)"
        elif any(w in low for w in ("accessdenied", "forbidden", "403", "signature", "invalidaccesskeyid",
                                     "unauthenticated", "permission")):
            why = ("the store refused the credentials: check the access and secret keys (or, without keys, "
                   "the AWS credential chain: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, "
                   "~/.aws/credentials, the instance role) and that they may use this bucket")
        elif any(w in low for w in ("connect", "dns", "resolve", "timed out", "timeout", "refused")):
            why = f"could not reach {self.endpoint}: check the endpoint URL and the network"
        else:
            why = "check the endpoint, the credentials and the bucket"
        # The store's own words may quote a key ("the access key AKIA... does not exist").
        first = secrets.redact(text.strip().splitlines()[0][:300]) if text.strip() else type(exc).__name__
        return StorageError(f"{op} {bucket}/{key} at {self.endpoint} failed: {why}. ({first})")

    def __reduce__(self) -> tuple[Any, ...]:
        return (Storage, (self.endpoint, self.access_key, self.secret_key, self.path_style, self.region,
                          self.provider, self.session_token))


# The obstore stores (one per bucket) of each Storage in use; equal Storages share them.
_STORES: dict[Storage, dict[str, Any]] = {}


def _client_module() -> Any:
    try:
        import obstore
    except ImportError:
        raise StorageError(
            "sky.Storage needs the storage extra, which is not installed: pip install 'skyward[storage]' "
            "(it brings obstore, the S3 client, and rclone, which mounts sky.Volume buckets)."
        ) from None
    return obstore


def _resolve(value: Credential, name: str) -> str:
    if isinstance(value, str):
        return value
    try:
        result = value()
        if inspect.isawaitable(result):
            result = _run(_awaited(result))
    except Exception as exc:
        raise StorageError(f"Storage({name}=...): the credential function raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(result, str) or not result:
        raise StorageError(f"Storage({name}=...): the credential function returned {type(result).__name__}, not a non-empty string.")
    secrets.register(result)  # read from a variable or a vault: as secret as one given as a string
    return result


async def _awaited(aw: Awaitable[Any]) -> Any:
    return await aw


def _run(coro: Any) -> Any:
    """Run a coroutine to completion from sync code, also when this thread runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=target, name="skyward-storage")
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


async def _ranged_download(obs: Any, store: Any, key: str, size: int, fd: int,
                           advance: Callable[[int], None]) -> None:
    limit = asyncio.Semaphore(_CONCURRENCY)
    # At most one range per connection in flight and at least _PART: fewer, larger requests
    # (servers such as moto read the whole object again for every range).
    step = max(_PART, -(-size // _CONCURRENCY))

    async def part(start: int) -> None:
        end = min(size, start + step)
        async with limit:
            # Streamed: memory stays at a few chunks however large the range.
            result = await obs.get_async(store, key, options={"range": (start, end)})
            offset = start
            async for chunk in result.stream(min_chunk_size=8 << 20):
                view = memoryview(chunk)
                written = 0
                while written < len(view):
                    written += os.pwrite(fd, view[written:], offset + written)
                offset += len(view)
                advance(len(view))
            if offset != end:
                raise StorageError(f"download of {key}: the range {start}-{end} ended at {offset}; try again.")

    await asyncio.gather(*(part(s) for s in range(0, size, step)))


def _chunks(path: Path, advance: Callable[[int], None]) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(_PART):
            advance(len(chunk))
            yield chunk


class _progress:
    """A transient rich progress bar for large transfers on a terminal; else nothing."""

    def __init__(self, what: str, total: int) -> None:
        self.what, self.total = what, total
        self.bar: Any = None
        self.lock = threading.Lock()

    def __enter__(self) -> Callable[[int], None]:
        if self.total >= _PROGRESS_FROM and sys.stderr.isatty():
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TransferSpeedColumn,
            )

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                TransferSpeedColumn(), transient=True)
            self.bar.start()
            self.task = self.bar.add_task(self.what, total=self.total)
        return self.advance

    def advance(self, n: int) -> None:
        if self.bar is not None:
            with self.lock:
                self.bar.advance(self.task, n)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()


# -- presets: each returns a Storage -----------------------------------------------------------
# What each preset reads from the environment when an argument is not given: argument ->
# variables, the first one set wins. The provider's own names where it has them (AWS, the b2
# command, Cloudflare's wrangler); GCS HMAC keys and Wasabi have none of their own, so these
# follow the AWS pattern.
ENV_VARS: dict[str, dict[str, tuple[str, ...]]] = {
    "S3": {"access_key": ("AWS_ACCESS_KEY_ID",), "secret_key": ("AWS_SECRET_ACCESS_KEY",),
           "session_token": ("AWS_SESSION_TOKEN",), "region": ("AWS_REGION", "AWS_DEFAULT_REGION")},
    "R2": {"account_id": ("R2_ACCOUNT_ID", "CLOUDFLARE_ACCOUNT_ID"), "access_key": ("R2_ACCESS_KEY_ID",),
           "secret_key": ("R2_SECRET_ACCESS_KEY",)},
    "GCS": {"access_key": ("GCS_ACCESS_KEY_ID",), "secret_key": ("GCS_SECRET_ACCESS_KEY",)},
    "Wasabi": {"access_key": ("WASABI_ACCESS_KEY",), "secret_key": ("WASABI_SECRET_KEY",)},
    "Backblaze": {"key_id": ("B2_APPLICATION_KEY_ID",), "app_key": ("B2_APPLICATION_KEY",)},
    "Hyperstack": {"api_key": ("HYPERSTACK_API_KEY",)},
}


KEYS = ("access_key", "secret_key", "session_token")
# Where a reproduction reads the keys a record did not keep, by the endpoint's preset: the
# preset's own variables (what sky.storage.S3() etc. read), so that the environment that made
# the pool gives them again as it is. Any other endpoint: SKYWARD_STORAGE_<ARGUMENT>.
_PRESET_ENDPOINTS = (
    ("S3", re.compile(r"^https://s3\.[a-z0-9-]+\.amazonaws\.com$")),
    ("R2", re.compile(r"^https://[^/]+\.r2\.cloudflarestorage\.com$")),
    ("GCS", re.compile(r"^https://storage\.googleapis\.com$")),
    ("Wasabi", re.compile(r"^https://s3\.[a-z0-9-]+\.wasabisys\.com$")),
    ("Backblaze", re.compile(r"^https://s3\.[a-z0-9-]+\.backblazeb2\.com$")),
    ("Hyperstack", re.compile(r"^https://[^/]+\.s3\.hyperstack\.cloud$")),
)
# A preset's arguments under the names of Storage's own fields.
_AS_FIELD = {"key_id": "access_key", "app_key": "secret_key", "api_key": "access_key"}


def key_variables(storage: Storage) -> dict[str, str]:
    """Storage field -> the environment variable a reproduction reads that key from: the
    preset's own (``AWS_SECRET_ACCESS_KEY`` for an S3 endpoint...), else
    ``SKYWARD_STORAGE_ACCESS_KEY``, ``..._SECRET_KEY``, ``..._SESSION_TOKEN``."""
    out = {name: f"SKYWARD_STORAGE_{name.upper()}" for name in KEYS}
    for preset, pattern in _PRESET_ENDPOINTS:
        if pattern.match(storage.endpoint):
            for argument, names in ENV_VARS[preset].items():
                field = _AS_FIELD.get(argument, argument)
                if field in out:
                    out[field] = names[0]
            if preset == "Hyperstack":  # one key is both
                out["secret_key"] = out["access_key"]
            break
    return out


@dataclass(frozen=True, slots=True)
class FromEnv:
    """A credential read from the environment variable ``name`` each time it is needed (where
    the transfer runs: on a node, the node's environment), so only the name is ever pickled."""

    name: str
    preset: str = "Storage"
    argument: str = "access_key"

    def __call__(self) -> str:
        value = os.environ.get(self.name)
        if not value:
            raise StorageError(
                f"sky.storage.{self.preset}: {self.name} is not set in this environment (it was where the "
                f"preset was made, and the {self.argument} is read from it when a transfer needs it). Set "
                f"{self.name} here (on nodes: Image(env=...)), or pass {self.argument}= to the preset."
            )
        return value

    def __repr__(self) -> str:
        return f"FromEnv({self.name!r})"


def _env_name(names: tuple[str, ...]) -> str | None:
    return next((n for n in names if os.environ.get(n)), None)


def _fill(preset: str, given: dict[str, Any], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    """The preset's arguments, each one not given taken from its environment variable (by name,
    for credentials); ConfigError naming every argument still missing and what to set."""
    out, missing = dict(given), []
    for argument, names in ENV_VARS[preset].items():
        if argument not in given or given[argument] is not None:
            continue
        found = _env_name(names)
        if found is not None:
            # Not secret, and part of the endpoint: read now. Credentials: read when used.
            out[argument] = os.environ[found] if argument in ("region", "account_id") else \
                FromEnv(found, preset, argument)
        elif argument not in optional:
            missing.append(f"{argument}= (or {' or '.join(names)})")
    if missing:
        raise ConfigError(
            f"sky.storage.{preset}() is missing {', '.join(missing)}: pass the argument"
            f"{'s' if len(missing) > 1 else ''}, or set the environment variable{'s' if len(missing) > 1 else ''} "
            f"named in parentheses."
        )
    return out


def S3(*, region: str | None = None, access_key: Credential | None = None,
       secret_key: Credential | None = None, session_token: Credential | None = None) -> Storage:
    """Amazon S3 in ``region`` (default ``AWS_REGION``, ``AWS_DEFAULT_REGION``, else ``us-east-1``).

    Keys not given come from ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` and
    ``AWS_SESSION_TOKEN``; with neither key given nor set, the AWS credential chain."""
    given = {"region": region, "access_key": access_key, "secret_key": secret_key, "session_token": session_token}
    keyed = access_key is not None or secret_key is not None or any(
        _env_name(ENV_VARS["S3"][k]) for k in ("access_key", "secret_key"))
    args = _fill("S3", given, optional=("region", "session_token") if keyed else
                 ("region", "access_key", "secret_key", "session_token"))
    where = args["region"] or "us-east-1"
    return Storage(f"https://s3.{where}.amazonaws.com", args["access_key"], args["secret_key"], region=where,
                   provider="AWS", session_token=args["session_token"] if args["access_key"] is not None else None)


def R2(*, account_id: str | None = None, access_key: Credential | None = None,
       secret_key: Credential | None = None) -> Storage:
    """Cloudflare R2 of ``account_id`` (an R2 API token's S3 keys); not given, they come from
    ``R2_ACCOUNT_ID`` (or ``CLOUDFLARE_ACCOUNT_ID``), ``R2_ACCESS_KEY_ID``, ``R2_SECRET_ACCESS_KEY``."""
    args = _fill("R2", {"account_id": account_id, "access_key": access_key, "secret_key": secret_key})
    return Storage(f"https://{args['account_id']}.r2.cloudflarestorage.com", args["access_key"], args["secret_key"],
                   region="auto", provider="Cloudflare")


def GCS(*, access_key: Credential | None = None, secret_key: Credential | None = None) -> Storage:
    """Google Cloud Storage through its S3-compatible XML API (HMAC keys of a service account);
    not given, they come from ``GCS_ACCESS_KEY_ID`` and ``GCS_SECRET_ACCESS_KEY``."""
    args = _fill("GCS", {"access_key": access_key, "secret_key": secret_key})
    return Storage("https://storage.googleapis.com", args["access_key"], args["secret_key"], region="auto",
                   provider="GCS")


def Wasabi(*, region: str = "us-east-1", access_key: Credential | None = None,
           secret_key: Credential | None = None) -> Storage:
    """Wasabi in ``region``; keys not given come from ``WASABI_ACCESS_KEY`` and ``WASABI_SECRET_KEY``."""
    args = _fill("Wasabi", {"access_key": access_key, "secret_key": secret_key})
    return Storage(f"https://s3.{region}.wasabisys.com", args["access_key"], args["secret_key"], region=region,
                   provider="Wasabi")


def Backblaze(*, region: str, key_id: Credential | None = None, app_key: Credential | None = None) -> Storage:
    """Backblaze B2's S3-compatible API in ``region`` (e.g. ``us-west-004``): an application key;
    not given, it comes from ``B2_APPLICATION_KEY_ID`` and ``B2_APPLICATION_KEY`` (as for the b2 command)."""
    args = _fill("Backblaze", {"key_id": key_id, "app_key": app_key})
    return Storage(f"https://s3.{region}.backblazeb2.com", args["key_id"], args["app_key"], region=region,
                   provider="Other")


def Hyperstack(*, api_key: Credential | None = None, region: str = "CANADA-1", secret_key: Credential | None = None,
               endpoint: str | None = None) -> Storage:
    """Hyperstack's S3-compatible object storage in ``region``.

    ``api_key`` (default: ``HYPERSTACK_API_KEY``) is the access key, and the secret too unless
    ``secret_key`` is given; ``endpoint`` overrides the regional URL this preset assumes."""
    args = _fill("Hyperstack", {"api_key": api_key})
    url = endpoint or f"https://{region.lower()}.s3.hyperstack.cloud"
    return Storage(url, args["api_key"], secret_key if secret_key is not None else args["api_key"], path_style=True,
                   region=region, provider="Other")
