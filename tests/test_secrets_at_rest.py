"""Secrets never stored or shown in clear.

A real Local pool mounts a bucket of a real S3-compatible server (moto) with ``sky.Storage``
keys, has a package index with a password in its URL, a secret ``Image.env`` value and a
token among the script's own arguments. While it runs and after it closed, no file under
SKYWARD_HOME holds any of them: not for its owner (records, the rebuild blob inside them, the
trail, the log file), not for another local user (``nobody``, through ``setpriv``), who reads
every file it can there and in the pool's folders. ``skyward history`` and ``skyward diff``
(real CLI processes, which know none of the secrets) show them masked, and a reproduction asks
for them again instead of finding them in the record.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import skyward as sky
from skyward.observe import secrets
from skyward.records import record

STORAGE_KEY = "AKIAATREST0000KEY1"
STORAGE_SECRET = "at-rest-storage-secret-4821"
OTHER_SECRET = "at-rest-other-secret-5150"  # the second pool's keys (for diff)
INDEX_PASSWORD = "at-rest-index-pass-9313"
ARGV_SECRET = "at-rest-argv-token-7742"
ENV_SECRET = "at-rest-env-secret-6067"
SECRETS = (STORAGE_KEY, STORAGE_SECRET, OTHER_SECRET, INDEX_PASSWORD, ARGV_SECRET, ENV_SECRET)
INDEX = f"https://alice:{INDEX_PASSWORD}@pkgs.invalid/simple"

TESTS = Path(__file__).resolve().parent
PROGRAM = textwrap.dedent(f"""
    import sys
    sys.path.insert(0, {str(TESTS)!r})
    from s3server import S3Server
    import skyward as sky

    quiet = sky.Options(console=False)
    image = sky.Image(pip_indexes=[sky.PipIndex({INDEX!r})], env={{"API_KEY": {ENV_SECRET!r}}})
    with S3Server("127.0.0.1") as s3:
        s3.create_bucket("at-rest")
        for n, secret in enumerate(({STORAGE_SECRET!r}, {OTHER_SECRET!r})):
            st = s3.storage(access_key={STORAGE_KEY!r}, secret_key=secret)
            volume = sky.Volume("at-rest", sys.argv[1] + f"/mnt{{n}}", storage=st)
            with sky.Compute(nodes=1, image=image, volumes=[volume], options=quiet) as pool:
                print("OPEN", pool.id, flush=True)
                if n == 0:
                    sys.stdin.readline()  # the test looks around while the pool runs
""")


def _mounts_fuse() -> str | None:
    sys.path.insert(0, str(TESTS))
    from s3server import fuse_skip_reason

    return fuse_skip_reason()


pytestmark = [
    pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) is not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user (setpriv) needs root"),
]


def found_in(data: bytes) -> list[str]:
    """The secrets in ``data``, also inside a record's rebuild blob (base64 of a pickle)."""
    texts = [data]
    try:
        parsed = json.loads(data)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("rebuild"), str):
        texts.append(base64.b64decode(parsed["rebuild"]))
    return [s for s in SECRETS if any(s.encode() in t for t in texts)]


def owner_scan(*roots: Path) -> dict[str, list[str]]:
    """file -> the secrets it holds, reading everything under ``roots`` as their owner."""
    out: dict[str, list[str]] = {}
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                try:
                    hits = found_in(path.read_bytes())
                except OSError:
                    continue  # a socket, a file that went away
                if hits:
                    out[str(path)] = hits
    return out


NOBODY_SCAN = """
import json, os, sys
hits, read = {}, 0
for root in sys.argv[2:]:
    for folder, dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError:
                continue
            read += 1
            found = [s for s in json.loads(sys.argv[1]) if s.encode() in data]
            if found:
                hits[path] = found
print(json.dumps({"hits": hits, "read": read}))
"""


def nobody_scan(*roots: Path) -> dict[str, object]:
    """What user ``nobody`` finds of the secrets in every file it can read under ``roots``."""
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-I",
                           "-c", NOBODY_SCAN, json.dumps(SECRETS), *map(str, roots)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    found: dict[str, object] = json.loads(proc.stdout)
    return found


@pytest.fixture
def world() -> Iterator[Path]:
    """A folder every user may enter (tmp_path is private to root), so that ``nobody`` is stopped
    by skyward's own file modes only."""
    root = Path(tempfile.mkdtemp(prefix="skyward-at-rest-"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def skyward(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The real CLI in a process of its own: it knows none of the secrets."""
    env = {**os.environ, "SKYWARD_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "skyward", *args], env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.skipif(_mounts_fuse() is not None, reason=_mounts_fuse() or "")
def test_no_storage_key_index_password_or_argument_at_rest_or_in_history(world: Path) -> None:
    home = world / "home"
    script = world / "program.py"
    script.write_text(PROGRAM)
    env = {**os.environ, "SKYWARD_HOME": str(home)}
    before = set(Path(tempfile.gettempdir()).glob("skyward-*"))
    proc = subprocess.Popen([sys.executable, str(script), str(world), f"--api-token={ARGV_SECRET}"], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        first = proc.stdout.readline()
        assert first.startswith("OPEN "), proc.stderr.read() if proc.stderr else ""
        # While the pool runs: its folders (the rclone config with the keys lives there) and the home.
        live = sorted(set(Path(tempfile.gettempdir()).glob("skyward-*")) - before)
        seen = nobody_scan(home, *live, Path("/dev/shm"))
        assert seen["hits"] == {}, f"another user read secrets while the pool ran: {seen}"
        proc.stdin.write("\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert proc.returncode == 0, err
    ids = [first.split()[1], out.split()[1]]

    assert owner_scan(home) == {}, "a secret is stored in clear under SKYWARD_HOME"
    seen = nobody_scan(home)
    assert seen["hits"] == {}

    # What the records keep instead: the keys as hashes, the index without its password.
    shown = skyward(home, "history", ids[0], "--json")
    assert shown.returncode == 0, shown.stderr
    rec = json.loads(shown.stdout)
    storage = rec["spec"]["volumes"][0]["storage"]
    assert storage["access_key"].startswith("hmac:") and storage["secret_key"].startswith("hmac:")
    assert rec["spec"]["image"]["pip_indexes"][0]["url"] == "https://***@pkgs.invalid/simple"
    assert rec["origin"]["argv"] == [str(world), "--api-token=***"]

    outputs = [skyward(home, "history", "--json"), shown, skyward(home, "history", ids[0]),
               skyward(home, "history"), skyward(home, "diff", ids[0], ids[1]),
               skyward(home, "diff", ids[0], ids[1], "--json"), skyward(home, "history", "--verify")]
    for result in outputs:
        assert result.returncode in (0, 1), result.stderr
        for text in (result.stdout, result.stderr):
            assert not [s for s in SECRETS if s in text], f"{result.args}: {text}"
    diffed = json.loads(outputs[5].stdout)
    assert any(d["key"].startswith("volumes") or "volumes" in d["key"] for d in diffed), diffed  # keys differ


def write_record(pool_id: str, spec: sky.Spec) -> str:
    worker = sky.Worker()
    record.write({
        "format": record.FORMAT, "id": pool_id, "name": None, "provider": "local", "created": time.time(),
        "spec": record.spec_view(spec, worker), "nodes": 1, "offer": None, "hourly_cost": None,
        "total_hourly_cost": None, "reproduces": None, "origin": {"argv": secrets.mask_argv(["--password", "pw-9z"])},
        "lock": {"packages": [], "apt": {}, "skyward": sky.__version__},
        "rebuild": record._rebuild_blob(spec, worker),
    })
    return pool_id


def test_a_reproduction_asks_for_the_storage_keys_and_index_credentials_again(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = sky.Storage("http://127.0.0.1:9000", STORAGE_KEY, STORAGE_SECRET, path_style=True)
    env_keyed = sky.Storage("http://127.0.0.1:9001", sky.storage.FromEnv("MY_KEY_ID"), sky.storage.FromEnv("MY_KEY"))
    spec = sky.Spec(image=sky.Image(pip_indexes=[sky.PipIndex(INDEX)]),
                    volumes=[sky.Volume("at-rest", "/data", storage=storage),
                             sky.Volume("by-name", "/other", storage=env_keyed)])
    pool_id = write_record("repro001", spec)
    blob = base64.b64decode(record.read(pool_id)["rebuild"])
    assert not [s for s in SECRETS if s.encode() in blob]
    assert b"MY_KEY_ID" in blob  # a key read from the environment is kept by its variable's name

    for name in ("SKYWARD_STORAGE_ACCESS_KEY", "SKYWARD_STORAGE_SECRET_KEY", "PIP_EXTRA_INDEX_URL",
                 "PIP_INDEX_URL", "UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX"):
        monkeypatch.delenv(name, raising=False)
    rep = record.reproduction(pool_id)
    said = "\n".join(rep.differences)
    assert "SKYWARD_STORAGE_SECRET_KEY" in said and "at-rest" in said, said
    assert "pkgs.invalid" in said and "PIP_EXTRA_INDEX_URL" in said, said
    assert not [s for s in SECRETS if s in said]
    assert rep.spec.image.pip_indexes[0].url == "https://pkgs.invalid/simple"
    assert rep.spec.volumes[1].storage.access_key == sky.storage.FromEnv("MY_KEY_ID")  # type: ignore[union-attr]

    # Given again here, they are used (and nothing is said about them).
    monkeypatch.setenv("SKYWARD_STORAGE_ACCESS_KEY", STORAGE_KEY)
    monkeypatch.setenv("SKYWARD_STORAGE_SECRET_KEY", STORAGE_SECRET)
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", INDEX)
    rep = record.reproduction(pool_id)
    assert rep.spec.volumes[0].storage.credentials() == (STORAGE_KEY, STORAGE_SECRET)  # type: ignore[union-attr]
    assert rep.spec.image.pip_indexes[0].url == INDEX
    assert not [d for d in rep.differences if "not recorded" in d], rep.differences
    monkeypatch.setenv("SKYWARD_STORAGE_SECRET_KEY", "a-different-secret")
    rep = record.reproduction(pool_id)
    assert any("differs from the recorded one" in d for d in rep.differences), rep.differences


def test_the_scripts_own_arguments_are_masked_by_rule() -> None:
    argv = ["train.py", "--lr", "0.1", "--api-token", "tok-12345", f"--password={INDEX_PASSWORD}",
            "HF_TOKEN=hf_abcdefgh", INDEX, "--name", "run-1"]
    assert secrets.mask_argv(argv) == ["train.py", "--lr", "0.1", "--api-token", "***", "--password=***",
                                        "HF_TOKEN=***", "https://***@pkgs.invalid/simple", "--name", "run-1"]


def test_an_older_record_with_keys_in_clear_is_shown_masked_and_its_pickle_withheld(home: Path) -> None:
    """Records written before this change hold the keys: history/diff show them masked."""
    storage = {"type": "Storage", "endpoint": "http://127.0.0.1:9000", "access_key": STORAGE_KEY,
               "secret_key": STORAGE_SECRET, "session_token": None}
    old = {"id": "old00001", "origin": {"argv": [f"--api-token={ARGV_SECRET}"]}, "rebuild": "cGlja2xl",
           "spec": {"volumes": [{"type": "Volume", "storage": storage}],
                    "image": {"pip_indexes": [{"url": INDEX}]}}}
    shown = record.shown(old)
    assert not [s for s in SECRETS if s in json.dumps(shown)], shown
    assert shown["rebuild"].startswith("withheld")
    assert shown["spec"]["image"]["pip_indexes"][0]["url"] == "https://***@pkgs.invalid/simple"
    new = {**old, "origin": {"argv": ["--api-token=***"]},
           "spec": {"volumes": [{"type": "Volume", "storage": {**storage, "access_key": "sha256:0123456789abcdef",
                                                               "secret_key": "sha256:fedcba9876543210"}}]}}
    assert record.shown(new) == new  # a record of this version is shown as it is, pickle and all
