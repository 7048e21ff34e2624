"""sky.Storage against a real S3-compatible server (moto in server mode, on loopback)."""

from __future__ import annotations

import hashlib
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from s3server import S3Server

import skyward as sky


def test_every_method_with_string_keys(s3: S3Server, bucket: str, tmp_path: Path) -> None:
    src = tmp_path / "model.pt"
    src.write_bytes(b"weights" * 1000)
    with s3.storage() as st:
        assert st.upload(bucket, src, key="checkpoints/model.pt") == "checkpoints/model.pt"
        assert st.upload(bucket, src) == "model.pt"  # key defaults to the file's name
        assert st.ls(bucket) == ["checkpoints/model.pt", "model.pt"]
        assert st.ls(bucket, prefix="checkpoints/") == ["checkpoints/model.pt"]
        assert st.ls(bucket, prefix="checkpoints/mo") == ["checkpoints/model.pt"]
        assert st.ls(bucket, prefix="nothing/") == []
        assert st.exists(bucket, "checkpoints/model.pt")
        assert not st.exists(bucket, "checkpoints/other.pt")
        out = st.download(bucket, "checkpoints/model.pt", tmp_path / "restored.pt")
        assert out.read_bytes() == src.read_bytes()
        into = tmp_path / "folder"
        into.mkdir()
        assert st.download(bucket, "model.pt", into) == into / "model.pt"
        st.rm(bucket, "checkpoints/model.pt")
        assert not st.exists(bucket, "checkpoints/model.pt")
        st.rm(bucket, "checkpoints/model.pt")  # a missing key: no error, as in S3
        assert st.ls(bucket) == ["model.pt"]


def test_credentials_from_sync_and_async_callables(s3: S3Server, bucket: str, tmp_path: Path) -> None:
    calls: list[str] = []

    def access() -> str:
        calls.append("access")
        return s3.access_key

    async def secret() -> str:
        calls.append("secret")
        return s3.secret_key

    (tmp_path / "a.txt").write_text("a")
    with sky.Storage(s3.endpoint, access_key=access, secret_key=secret, path_style=True) as st:
        st.upload(bucket, tmp_path / "a.txt")
        assert st.ls(bucket) == ["a.txt"]
    assert "access" in calls and "secret" in calls


def test_a_credential_function_that_fails_says_so(s3: S3Server, bucket: str) -> None:
    def broken() -> str:
        raise KeyError("MY_KEY")

    st = sky.Storage(s3.endpoint, access_key=broken, secret_key="x", path_style=True)
    with pytest.raises(sky.StorageError, match="access_key"):
        st.ls(bucket)


def test_large_file_goes_in_parts_both_ways(s3: S3Server, bucket: str, tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(80 << 20))  # 3 parts of 32 MB each way
    with s3.storage() as st:
        st.upload(bucket, src, key="big.bin")
        out = st.download(bucket, "big.bin", tmp_path / "out.bin")
    assert hashlib.sha256(out.read_bytes()).digest() == hashlib.sha256(src.read_bytes()).digest()
    assert not list(tmp_path.glob(".*skyward-part"))


def test_upload_a_folder(s3: S3Server, bucket: str, tmp_path: Path) -> None:
    (tmp_path / "ds" / "sub").mkdir(parents=True)
    (tmp_path / "ds" / "a.txt").write_text("a")
    (tmp_path / "ds" / "sub" / "b.txt").write_text("b")
    with s3.storage() as st:
        assert st.upload(bucket, tmp_path / "ds", key="v1") == "v1"
        assert st.ls(bucket) == ["v1/a.txt", "v1/sub/b.txt"]


def test_errors_name_the_bucket_the_key_and_what_to_check(s3: S3Server, bucket: str, tmp_path: Path) -> None:
    with s3.storage() as st:
        with pytest.raises(sky.StorageError, match=r"bucket 'no-such-bucket' does not exist"):
            st.ls("no-such-bucket")
        with pytest.raises(sky.StorageError, match=r"does not exist"):
            st.exists("no-such-bucket", "k")
        with pytest.raises(sky.StorageError, match=rf"no object 'missing.bin' in bucket '{bucket}'"):
            st.download(bucket, "missing.bin", tmp_path / "x")
        assert not (tmp_path / "x").exists()
        with pytest.raises(sky.StorageError, match="not a file or folder"):
            st.upload(bucket, tmp_path / "nope.txt")


def test_unreachable_endpoint_says_check_the_endpoint() -> None:
    st = sky.Storage("http://127.0.0.1:9", access_key="a", secret_key="b", path_style=True)
    with pytest.raises(sky.StorageError, match=r"could not reach http://127\.0\.0\.1:9"):
        st.ls("some-bucket")


def test_virtual_hosted_style_is_the_default() -> None:
    # Without path_style the bucket goes in the host name: against a bare IP that cannot
    # resolve, and the error is about reaching the endpoint (not a silent path-style fallback).
    st = sky.Storage("http://127.0.0.1:9", access_key="a", secret_key="b")
    assert st.path_style is False
    with pytest.raises(sky.StorageError):
        st.ls("bucket")


def test_presets() -> None:
    s3 = sky.storage.S3(region="eu-west-1")
    assert s3.endpoint == "https://s3.eu-west-1.amazonaws.com" and s3.signing_region == "eu-west-1"
    assert s3.access_key is None  # the AWS credential chain
    r2 = sky.storage.R2(account_id="abc", access_key="k", secret_key="s")
    assert r2.endpoint == "https://abc.r2.cloudflarestorage.com" and r2.provider == "Cloudflare"
    assert sky.storage.GCS(access_key="k", secret_key="s").endpoint == "https://storage.googleapis.com"
    assert sky.storage.Wasabi(region="eu-central-1", access_key="k", secret_key="s").endpoint == \
        "https://s3.eu-central-1.wasabisys.com"
    b2 = sky.storage.Backblaze(region="us-west-004", key_id="id", app_key="key")
    assert b2.endpoint == "https://s3.us-west-004.backblazeb2.com" and b2.credentials() == ("id", "key")
    hs = sky.storage.Hyperstack(api_key="k", region="CANADA-1")
    assert isinstance(hs, sky.Storage) and hs.path_style
    for preset in (s3, r2, b2, hs):
        assert isinstance(preset, sky.Storage)


def test_storage_validation_and_repr_hides_keys() -> None:
    with pytest.raises(sky.ConfigError, match="http"):
        sky.Storage("s3.amazonaws.com")
    with pytest.raises(sky.ConfigError, match="both keys"):
        sky.Storage("https://x.example", access_key="a")
    with pytest.raises(sky.ConfigError, match="a string, or a function"):
        sky.Storage("https://x.example", access_key=42, secret_key="b")  # type: ignore[arg-type]
    st = sky.Storage("https://x.example/", access_key="AKIA-secret-id", secret_key="very-secret")
    assert st.endpoint == "https://x.example"
    assert "secret" not in repr(st)
    assert pickle.loads(pickle.dumps(st)) == st


def test_missing_extra_says_how_to_install(tmp_path: Path) -> None:
    # A fresh interpreter where obstore cannot be imported.
    blocker = tmp_path / "obstore.py"
    blocker.write_text("raise ImportError('blocked for the test')\n")
    code = ("import skyward as sky\n"
            "try:\n    sky.Storage('http://127.0.0.1:9', 'a', 'b').ls('x')\n"
            "except sky.StorageError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    assert "pip install 'skyward[storage]'" in out.stdout, out.stderr


def test_a_long_transfer_shows_a_progress_bar_on_a_terminal(s3: S3Server, bucket: str, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    import rich.progress

    from skyward import storage

    bars: list[dict[str, object]] = []

    class Bar:
        def __init__(self, *columns: object, **kw: object) -> None:
            self.state: dict[str, object] = {"done": 0, "started": False, "stopped": False}
            bars.append(self.state)

        def start(self) -> None:
            self.state["started"] = True

        def add_task(self, what: str, total: int) -> int:
            self.state.update(what=what, total=total)
            return 0

        def advance(self, task: int, n: int) -> None:
            self.state["done"] = int(self.state["done"]) + n  # type: ignore[call-overload]

        def stop(self) -> None:
            self.state["stopped"] = True

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(rich.progress, "Progress", Bar)
    monkeypatch.setattr(storage, "_PROGRESS_FROM", 1 << 20)
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(3 << 20))
    st = s3.storage()
    st.upload(bucket, src, key="small.bin")  # not a terminal: no bar
    assert bars == []
    monkeypatch.setattr(sys, "stderr", Terminal())
    st.upload(bucket, src, key="big.bin")
    st.download(bucket, "big.bin", tmp_path / "back.bin")
    assert [b["what"] for b in bars] == ["upload big.bin", "download big.bin"]
    assert all(b["total"] == b["done"] == 3 << 20 and b["started"] and b["stopped"] for b in bars)


def test_a_refused_credential_names_the_bucket_the_key_and_the_keys_to_check() -> None:
    # moto accepts any key, so the store's answer is made up here: what S3 says to a bad key.
    st = sky.Storage("https://s3.eu-west-1.amazonaws.com", access_key="a", secret_key="b")
    err = st._error("download", "my-bucket", "ckpt/model.pt",
                    RuntimeError("Client error with status 403 Forbidden: <Code>InvalidAccessKeyId</Code>"))
    text = str(err)
    assert text.startswith("download my-bucket/ckpt/model.pt at https://s3.eu-west-1.amazonaws.com failed")
    assert "check the access and secret keys" in text and "AWS_PROFILE" in text
