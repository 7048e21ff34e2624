"""The apps benchmarks/serve.py serves: the same handlers under uvicorn, pool.serve and Ray Serve."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

MODEL: dict[str, Any] = {}


def fit() -> Any:
    """A random forest of 20 trees on 8 features: one prediction is about a millisecond of CPU."""
    import numpy as np
    from sklearn.ensemble import RandomForestRegressor

    rng = np.random.default_rng(0)
    x = rng.random((2000, 8))
    return RandomForestRegressor(n_estimators=20, max_depth=8, random_state=0, n_jobs=1).fit(x, x.sum(axis=1))


async def _echo(request: Request) -> Response:
    return JSONResponse(await request.json())


async def _predict(request: Request) -> Response:
    body = await request.json()
    y = MODEL["forest"].predict([body["x"]])[0]
    return JSONResponse({"id": body["id"], "y": float(y)})


@contextlib.asynccontextmanager
async def _load(app: Starlette) -> AsyncIterator[None]:
    MODEL["forest"] = fit()
    yield


echo = Starlette(routes=[Route("/", _echo, methods=["POST"])])
predict = Starlette(routes=[Route("/", _predict, methods=["POST"])], lifespan=_load)


def ray_deployment(handler: str, replicas: int) -> Any:
    """The same handler as a Ray Serve deployment of ``replicas`` replicas."""
    from ray import serve

    @serve.deployment(num_replicas=replicas, ray_actor_options={"num_cpus": 0})
    class Handler:
        def __init__(self) -> None:
            self.forest = fit() if handler == "predict" else None

        async def __call__(self, request: Request) -> Response:
            body = await request.json()
            if self.forest is None:
                return JSONResponse(body)
            return JSONResponse({"id": body["id"], "y": float(self.forest.predict([body["x"]])[0])})

    return Handler.bind()
