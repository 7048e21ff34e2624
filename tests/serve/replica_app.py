"""The app the router tests serve: a small Starlette app, run by uvicorn on a Unix socket in a
subprocess (``python -m uvicorn tests.serve.replica_app:app --uds PATH``). ``REPLICA`` in its
environment names it; every answer says which replica gave it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

NAME = os.environ.get("REPLICA", "?")


async def echo(request: Request) -> JSONResponse:
    body = await request.body()
    return JSONResponse({"replica": NAME, "query": request.url.query, "body": body.decode(),
                         "headers": {k: v for k, v in request.headers.items()}})


async def slow(request: Request) -> JSONResponse:
    await request.body()
    seconds = float(request.query_params.get("s", "1"))
    mark = request.query_params.get("mark")
    if mark:
        Path(mark).write_text(NAME)
    await asyncio.sleep(seconds)
    return JSONResponse({"replica": NAME, "slept": seconds})


async def events(request: Request) -> StreamingResponse:
    gate = Path(request.query_params["gate"])

    async def produce():
        yield b"data: first\n\n"
        for _ in range(600):
            if gate.exists():
                break
            await asyncio.sleep(0.05)
        yield b"data: last\n\n"

    return StreamingResponse(produce(), media_type="text/event-stream")


async def upload(request: Request) -> JSONResponse:
    mark = Path(request.query_params["mark"])
    total = 0
    async for chunk in request.stream():
        if chunk and not total:
            mark.write_text("started")
        total += len(chunk)
    return JSONResponse({"replica": NAME, "bytes": total})


async def head_only(request: Request) -> Response:
    return Response(b"x" * 10, media_type="text/plain")


async def ws_echo(ws: WebSocket) -> None:
    await ws.accept()
    try:
        while True:
            text = await ws.receive_text()
            await ws.send_text(f"{NAME}:{text}")
    except Exception:
        pass


app = Starlette(routes=[
    Route("/echo", echo, methods=["GET", "POST", "PUT"]),
    Route("/slow", slow, methods=["GET", "POST"]),
    Route("/events", events),
    Route("/upload", upload, methods=["POST"]),
    Route("/fixed", head_only, methods=["GET", "HEAD"]),
    WebSocketRoute("/ws", ws_echo),
])
