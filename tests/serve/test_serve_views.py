"""What a pool shows of its endpoints: the access log file and the Prometheus series, with a
real pool, real replicas and real requests through the router."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from helpers import wait_for

import skyward as sky
from skyward.observe import events, prometheus
from skyward.observe import secrets as masking
from skyward.serve.access import line, mask_path
from skyward.serve.router import AccessRecord

pytestmark = pytest.mark.timeout(300)
APPS = "serve.apps"
SECRET = "s3cr3t-in-a-query-4711"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[sky.Pool, Any, Path]]:
    folder = tmp_path_factory.mktemp("logs")
    options = sky.Options(console=False, metrics_port=0,
                          logging=sky.LogConfig(file=str(folder / "skyward.log"), console=False))
    with sky.Compute(nodes=1, options=options) as pool, pool.serve(f"{APPS}:app") as endpoint:
        endpoint.wait_ready(timeout=120)
        masking.register(SECRET)
        with httpx.Client(base_url=endpoint.url, headers=endpoint.headers, timeout=30) as client:
            for _ in range(5):
                assert client.get("/whoami").status_code == 200
            assert client.get("/whoami", params={"api_key": "k-123", "sleep": "0"}).status_code == 200
            assert client.get("/whoami", params={"q": SECRET}).status_code == 200
            assert client.get("/whoami", params={"again": endpoint.token}).status_code == 200
            assert client.get("/no/such/page").status_code == 404
        assert httpx.get(endpoint.url + "/whoami", timeout=30).status_code == 401
        yield pool, endpoint, folder


def test_each_request_is_a_line_of_the_access_log_with_its_secrets_masked(served: tuple) -> None:
    pool, endpoint, folder = served
    port = endpoint.url.rsplit(":", 1)[1]
    path = folder / f"access-{pool.id}-{port}.log"
    assert endpoint.access_log.path == path
    lines = wait_for(lambda: t if len(t := path.read_text().splitlines()) >= 10 else None, 30, "10 lines")
    assert len(lines) == 10, lines
    assert (path.stat().st_mode & 0o777) == 0o600
    first = lines[0].split(" ")
    assert first[0].endswith("Z") and first[1] == "127.0.0.1", first
    assert first[2:5] == ["GET", "/whoami", "200"] and first[5].endswith("ms") and first[6] == "0.0", first
    text = "\n".join(lines)
    assert SECRET not in text and endpoint.token not in text and "k-123" not in text
    assert text.count("GET /whoami ") == 9  # the router logs the path without its query
    assert "GET /no/such/page 404" in text and " 401 " in lines[-1] and lines[-1].endswith(" -")


def test_a_line_masks_registered_secrets_and_secret_named_parameters_of_a_query(served: tuple) -> None:
    _, endpoint, _ = served
    record = AccessRecord("GET", f"/a?api_key=k-123&q={SECRET}&t={quote(endpoint.token)}&page=2", 200, 0.0123,
                          "1.0", "10.0.0.7")
    text = line(record, when=0.5)
    assert text == "1970-01-01T00:00:00.500Z 10.0.0.7 GET /a?api_key=***&q=***&t=***&page=2 200 12.3ms 1.0"


def test_mask_path_masks_secret_named_parameters_only() -> None:
    assert mask_path("/a?token=x&page=2&API-KEY=y&password=") == "/a?token=***&page=2&API-KEY=***&password=***"
    assert mask_path("/plain") == "/plain" and mask_path("/a?flag") == "/a?flag"


def _scrape() -> str:
    address = prometheus.metrics_address()
    assert address is not None
    request = urllib.request.Request(f"http://{address[0]}:{address[1]}/metrics",
                                     headers={"Authorization": f"Bearer {prometheus.metrics_token()}"})
    return urllib.request.urlopen(request, timeout=10).read().decode()


def test_the_endpoints_series_are_scraped_with_the_pools(served: tuple) -> None:
    pool, endpoint, _ = served
    labels = f'endpoint="{endpoint.url.removeprefix("http://")}",pool="{pool.id}"'

    def scraped() -> dict[str, float] | None:
        events.bus.flush()
        text = _scrape()
        got = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
               for line in text.splitlines() if line.startswith("skyward_endpoint")}
        return got if got.get(f"skyward_endpoint_request_duration_seconds_count{{{labels}}}") == 10 else None

    got = wait_for(scraped, 30, "the endpoint's 10 requests in /metrics")
    assert got[f'skyward_endpoint_requests_total{{{labels},status="200"}}'] == 8
    assert got[f'skyward_endpoint_requests_total{{{labels},status="404"}}'] == 1
    assert got[f'skyward_endpoint_requests_total{{{labels},status="401"}}'] == 1
    endpoint_label = labels.split(",")[0]
    assert got[f'skyward_endpoint_request_duration_seconds_bucket{{{endpoint_label},le="+Inf",pool="{pool.id}"}}'] == 10
    assert 0 < got[f"skyward_endpoint_request_duration_seconds_sum{{{labels}}}"] < 30
    assert got[f"skyward_endpoint_in_flight{{{labels}}}"] == 0
    assert got[f"skyward_endpoint_queued{{{labels}}}"] == 0
    assert got[f"skyward_endpoint_cold_starts_total{{{labels}}}"] == 0
    assert got[f'skyward_endpoint_replicas{{{labels},state="ready"}}'] == 1
    assert got[f'skyward_endpoint_replicas{{{labels},state="starting"}}'] == 0
