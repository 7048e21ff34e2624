"""The storage presets read what is not given from their providers' usual environment variables
, by name, and say which variable or argument is missing."""

from __future__ import annotations

import contextlib
import dataclasses
import http.server
import pickle
import threading
from collections.abc import Iterator

import pytest

import skyward as sky
from skyward.storage import ENV_VARS, FromEnv

ALL_VARS = sorted({v for preset in ENV_VARS.values() for names in preset.values() for v in names})


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start from an environment with none of the presets' variables."""
    for name in ALL_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("make", "env", "keys"),
    [
        (lambda: sky.storage.S3(), {"AWS_ACCESS_KEY_ID": "AKIA1", "AWS_SECRET_ACCESS_KEY": "s3-secret"},
         ("AKIA1", "s3-secret")),
        (lambda: sky.storage.R2(), {"R2_ACCOUNT_ID": "acct", "R2_ACCESS_KEY_ID": "r2-id",
                                    "R2_SECRET_ACCESS_KEY": "r2-secret"}, ("r2-id", "r2-secret")),
        (lambda: sky.storage.GCS(), {"GCS_ACCESS_KEY_ID": "GOOG1", "GCS_SECRET_ACCESS_KEY": "gcs-secret"},
         ("GOOG1", "gcs-secret")),
        (lambda: sky.storage.Wasabi(), {"WASABI_ACCESS_KEY": "wa-id", "WASABI_SECRET_KEY": "wa-secret"},
         ("wa-id", "wa-secret")),
        (lambda: sky.storage.Backblaze(region="us-west-004"),
         {"B2_APPLICATION_KEY_ID": "b2-id", "B2_APPLICATION_KEY": "b2-secret"}, ("b2-id", "b2-secret")),
        (lambda: sky.storage.Hyperstack(), {"HYPERSTACK_API_KEY": "hs-secret"}, ("hs-secret", "hs-secret")),
    ],
    ids=["S3", "R2", "GCS", "Wasabi", "Backblaze", "Hyperstack"],
)
def test_each_preset_reads_its_variables_by_name(monkeypatch: pytest.MonkeyPatch, make, env, keys) -> None:  # type: ignore[no-untyped-def]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    st = make()
    assert isinstance(st.access_key, FromEnv) and st.credentials() == keys
    # Only the variables' names travel: not in a pickle (a task, a record), not in the repr.
    blob = pickle.dumps(st)
    assert not any(secret.encode() in blob for secret in keys if "secret" in secret)
    assert all(secret not in repr(st) for secret in keys)
    again = pickle.loads(blob)
    assert again == st and again.credentials() == keys


def test_r2_takes_the_account_from_cloudflare_account_id_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOUDFLARE_ACCOUNT_ID", "cf-acct")
    st = sky.storage.R2(access_key="k", secret_key="s")
    assert st.endpoint == "https://cf-acct.r2.cloudflarestorage.com" and st.credentials() == ("k", "s")


def test_arguments_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "from-env")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    monkeypatch.setenv("AWS_REGION", "ap-south-1")
    st = sky.storage.S3(access_key="given", region="eu-west-1")
    assert st.credentials() == ("given", "env-secret")  # the one not given still comes from the env
    assert st.endpoint == "https://s3.eu-west-1.amazonaws.com"


def test_s3_region_from_the_environment_and_the_chain_without_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    st = sky.storage.S3()
    assert st.access_key is None and st.signing_region == "us-east-1"  # the AWS credential chain
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-central-1")
    assert sky.storage.S3().signing_region == "eu-central-1"
    monkeypatch.setenv("AWS_REGION", "eu-west-3")  # AWS_REGION first, as the AWS SDKs do
    assert sky.storage.S3().endpoint == "https://s3.eu-west-3.amazonaws.com"
    monkeypatch.setenv("AWS_SESSION_TOKEN", "lonely")  # a token without keys: still the chain
    assert sky.storage.S3().access_key is None


@pytest.mark.parametrize(
    ("make", "env", "says"),
    [
        (lambda: sky.storage.S3(), {"AWS_ACCESS_KEY_ID": "AKIA1"},
         ["secret_key= (or AWS_SECRET_ACCESS_KEY)"]),
        (lambda: sky.storage.S3(secret_key="s"), {}, ["access_key= (or AWS_ACCESS_KEY_ID)"]),
        (lambda: sky.storage.R2(), {},
         ["account_id= (or R2_ACCOUNT_ID or CLOUDFLARE_ACCOUNT_ID)", "access_key= (or R2_ACCESS_KEY_ID)",
          "secret_key= (or R2_SECRET_ACCESS_KEY)"]),
        (lambda: sky.storage.GCS(access_key="GOOG1"), {}, ["secret_key= (or GCS_SECRET_ACCESS_KEY)"]),
        (lambda: sky.storage.Wasabi(), {"WASABI_SECRET_KEY": "x"}, ["access_key= (or WASABI_ACCESS_KEY)"]),
        (lambda: sky.storage.Backblaze(region="us-west-004"), {},
         ["key_id= (or B2_APPLICATION_KEY_ID)", "app_key= (or B2_APPLICATION_KEY)"]),
        (lambda: sky.storage.Hyperstack(), {"HYPERSTACK_API_KEY": ""}, ["api_key= (or HYPERSTACK_API_KEY)"]),
    ],
    ids=["S3-secret", "S3-id", "R2", "GCS", "Wasabi", "Backblaze", "Hyperstack-empty"],
)
def test_a_missing_credential_names_the_argument_and_the_variable(monkeypatch: pytest.MonkeyPatch, make,  # type: ignore[no-untyped-def]
                                                                    env, says) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(sky.ConfigError) as info:
        make()
    message = str(info.value)
    for part in says:
        assert part in message, message
    assert "set the environment variable" in message


def test_a_variable_unset_after_the_preset_was_made_is_named_when_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WASABI_ACCESS_KEY", "id")
    monkeypatch.setenv("WASABI_SECRET_KEY", "secret")
    st = sky.storage.Wasabi()
    monkeypatch.delenv("WASABI_SECRET_KEY")
    with pytest.raises(sky.StorageError, match=r"WASABI_SECRET_KEY is not set.*secret_key="):
        st.credentials()


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[dict[str, str]] = []

    def _answer(self) -> None:
        type(self).seen.append({k.lower(): v for k, v in self.headers.items()})
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_GET = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[str]:
    _Recorder.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_s3_keys_and_session_token_from_the_environment_are_what_is_sent(
        monkeypatch: pytest.MonkeyPatch, recorder: str) -> None:
    pytest.importorskip("obstore", reason="the storage extra is not installed")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFROMENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-from-env")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "token-from-env")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    # The preset's credentials, sent to a server on loopback that records the request.
    st = dataclasses.replace(sky.storage.S3(), endpoint=recorder, path_style=True)
    with st, contextlib.suppress(sky.StorageError):  # what the server answers does not matter here
        st.exists("bucket", "key")
    request = _Recorder.seen[0]
    assert "Credential=AKIAFROMENV/" in request["authorization"] and "/eu-west-1/s3/" in request["authorization"]
    assert request["x-amz-security-token"] == "token-from-env"


def test_the_session_token_goes_into_the_volume_mount_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from skyward.bootstrap.mounts import Plan

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFROMENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-from-env")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "token-from-env")
    plan = Plan.of([sky.Volume("data", "/data", storage=sky.storage.S3())])
    assert "access_key_id = AKIAFROMENV" in plan.config and "session_token = token-from-env" in plan.config
    with pytest.raises(sky.ConfigError, match="session_token"):
        sky.Storage("https://x.example", session_token="t")
