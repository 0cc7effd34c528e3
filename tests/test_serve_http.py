"""The front door's middleware without a runtime: readiness (503), the token
(401), the loopback exemption and the rate limit (429)."""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from coterie.runtime.config import ServeSettings
from coterie.runtime.serve.app import build_app, set_backend, set_starting_error
from coterie.runtime.serve.http import TokenBucket

TOKEN = "t" * 32


async def client_for(tmp_path: Path, **settings: object) -> TestClient:
    app = build_app(tmp_path, ServeSettings(**settings), token=TOKEN)  # type: ignore[arg-type]
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[TestClient]:
    c = await client_for(tmp_path)
    yield c
    await c.close()


AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def test_v1_answers_503_until_the_runtime_is_up(client: TestClient) -> None:
    response = await client.get("/v1/personas", headers=AUTH)
    assert response.status == 503
    body = await response.json()
    assert body["error"]["type"] == "starting" and "starting" in body["error"]["message"]
    set_starting_error(client.app, "the runtime could not start: no Ray")  # type: ignore[arg-type]
    body = await (await client.get("/v1/personas", headers=AUTH)).json()
    assert body["error"]["message"] == "the runtime could not start: no Ray"


async def test_the_token_is_checked_before_anything_else(client: TestClient) -> None:
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": f"Basic {TOKEN}"}):
        response = await client.get("/v1/health", headers=headers)
        assert response.status == 401, headers
        assert (await response.json())["error"]["type"] == "unauthorized"


async def test_unknown_routes_are_json_404(client: TestClient) -> None:
    """Once the runtime is up. The server listens before that, and aiohttp
    deprecates changing a started application's keys (and means to refuse
    it), so the runtime arrives on the app's state object, warning-free."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        set_backend(client.app, object())  # type: ignore[arg-type]  # never reached
    assert [str(w.message) for w in caught] == []
    response = await client.get("/v1/nothing-here", headers=AUTH)
    assert response.status == 404  # past the 503: the runtime is there
    assert (await response.json())["error"]["type"] == "not_found"


async def test_loopback_may_be_exempted(tmp_path: Path) -> None:
    client = await client_for(tmp_path, loopback_without_token=True)
    try:
        response = await client.get("/v1/health")
        assert response.status == 503  # past the token check: only the runtime is missing
    finally:
        await client.close()


async def test_rate_limit_answers_429(tmp_path: Path) -> None:
    client = await client_for(tmp_path, rate_per_minute=3)
    try:
        statuses = [(await client.get("/v1/health", headers=AUTH)).status for _ in range(4)]
        assert statuses == [503, 503, 503, 429]
        body = await (await client.get("/v1/health", headers=AUTH)).json()
        assert body["error"]["type"] == "rate_limited" and "retry in" in body["error"]["message"]
    finally:
        await client.close()


def test_token_bucket_refills_over_time() -> None:
    now = [0.0]
    bucket = TokenBucket(60, clock=lambda: now[0])
    assert all(bucket.take("a") == 0 for _ in range(60))
    assert bucket.take("a") == pytest.approx(1.0)
    assert bucket.take("b") == 0  # per client
    now[0] = 2.0
    assert bucket.take("a") == 0 and bucket.take("a") == 0
    assert bucket.take("a") > 0
