"""Apps the serving tests serve: real Starlette apps, with a model loaded at startup."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

STATE: dict[str, object] = {}


@contextlib.asynccontextmanager
async def _lifespan(app: Starlette) -> AsyncIterator[None]:
    # A small scikit-learn model, fitted once per replica at startup (what loading a model is).
    from sklearn.linear_model import LinearRegression

    model = LinearRegression().fit([[0.0], [1.0], [2.0]], [1.0, 3.0, 5.0])  # y = 2x + 1
    STATE["model"] = model
    STATE["started"] = time.time()
    yield


async def predict(request: Request) -> Response:
    body = await request.json()
    model = STATE["model"]
    y = model.predict([[float(body["x"])]])[0]  # type: ignore[attr-defined]
    return JSONResponse({"x": body["x"], "y": round(float(y), 6), "pid": os.getpid(),
                         "host": socket.gethostname(), "auth": request.headers.get("authorization")})


async def whoami(request: Request) -> Response:
    await asyncio.sleep(float(request.query_params.get("sleep", "0")))
    return JSONResponse({"pid": os.getpid(), "host": socket.gethostname(), "version": STATE.get("version", 1)})


async def health(request: Request) -> Response:
    return PlainTextResponse("ok")


async def tokens(request: Request) -> Response:
    gate = request.query_params["gate"]  # a file the test creates once it read the first token

    async def produce() -> AsyncIterator[bytes]:
        yield b"data: first\n\n"
        for _ in range(600):
            if os.path.exists(gate):
                break
            await asyncio.sleep(0.05)
        yield b"data: last\n\n"

    return StreamingResponse(produce(), media_type="text/event-stream")


routes = [Route("/predict", predict, methods=["POST"]), Route("/whoami", whoami),
          Route("/health", health), Route("/tokens", tokens)]
app = Starlette(routes=routes, lifespan=_lifespan)


def make_app_v2() -> Starlette:
    """A factory: the app's second version (``/whoami`` says version 2)."""
    STATE["version"] = 2
    return Starlette(routes=routes, lifespan=_lifespan)


@contextlib.asynccontextmanager
async def _failing(app: Starlette) -> AsyncIterator[None]:
    raise RuntimeError("the model file is missing")
    yield


broken = Starlette(routes=routes, lifespan=_failing)
