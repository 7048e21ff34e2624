"""What every provider's serving tests check, on a pool whose nodes can import ``apps``
(tests/serve/apps.py, shipped to them by the Image's includes) and have uvicorn, starlette and
scikit-learn (from the Image's pip)."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

import skyward as sky
from skyward.serve.endpoint import Endpoint

APPS = Path(__file__).with_name("apps.py")  # Image(includes=[str(APPS)]): "apps" on a node
PIP = ["uvicorn", "starlette", "scikit-learn"]


def image() -> sky.Image:
    """An Image whose nodes can serve ``apps:app``."""
    return sky.Image(pip=PIP, includes=[str(APPS)])


@sky.function
def touch(path: str) -> None:
    Path(path).touch()


def every_request_is_answered_by_both_nodes(endpoint: Endpoint, requests: int = 200) -> None:
    with httpx.Client(base_url=endpoint.url, headers=endpoint.headers, timeout=60) as client:
        def ask(x: int) -> dict:
            r = client.post("/predict", json={"x": x})
            assert r.status_code == 200, r.text
            return r.json()

        with ThreadPoolExecutor(16) as ex:
            answers = list(ex.map(ask, range(requests)))
    assert [a["y"] for a in answers] == [2.0 * x + 1 for x in range(requests)]
    # Both replicas took some. A replica is told by its host and pid: netns SSH hosts and containers
    # have pid namespaces of their own, where two replicas can have the same pid.
    replicas = {(a["host"], a["pid"]) for a in answers}
    assert len(replicas) == 2, replicas
    assert all(a["auth"] is None for a in answers)  # the endpoint's token stops at the router


def events_pass_through_as_they_are_produced(pool: sky.Pool, endpoint: Endpoint) -> None:
    """The first event reaches the client while the app still waits for a gate file on its node,
    which the test makes (on every node) only after reading that event."""
    gate = f"/tmp/skyward-serve-gate-{uuid.uuid4().hex}"
    with httpx.Client(timeout=60) as client, client.stream(
            "GET", endpoint.url + "/tokens", params={"gate": gate}, headers=endpoint.headers) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        assert next(lines) == "data: first"  # before the last is produced: the gate is not there yet
        touch(gate) @ pool
        rest = [line for line in lines if line]
    assert rest == ["data: last"]


class Load:
    """``clients`` threads sending ``GET /whoami`` (each answer after ``sleep`` s) back to back
    while the ``with`` block runs: every status, and the replicas that answered, each as
    (host name, pid) (two hosts' pid namespaces may give two replicas the same pid)."""

    def __init__(self, endpoint: Endpoint, *, clients: int = 8, sleep: float = 0.02, timeout: float = 60) -> None:
        self.endpoint, self.sleep, self.timeout = endpoint, sleep, timeout
        self.statuses: list[int] = []
        self.pids: set[tuple[str, int]] = set()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, name=f"load-{i}") for i in range(clients)]

    def _run(self) -> None:
        with httpx.Client(base_url=self.endpoint.url, headers=self.endpoint.headers, timeout=self.timeout) as client:
            while not self._stop.is_set():
                r = client.get("/whoami", params={"sleep": str(self.sleep)})
                self.statuses.append(r.status_code)
                if r.status_code == 200:
                    body = r.json()
                    self.pids.add((body["host"], body["pid"]))

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()

    def failed(self) -> set[int]:
        """The statuses other than 200 that came (none: every request was answered)."""
        return {s for s in self.statuses if s != 200}
