"""The memory store on an object-store URI: a local S3-compatible server (moto)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from coterie.runtime.memory import HashingEmbedder, MemoryStore

KEYS = {"aws_access_key_id": "test", "aws_secret_access_key": "test", "aws_region": "us-east-1"}


@pytest.fixture
def s3_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    for key, value in KEYS.items():
        monkeypatch.setenv(key.upper(), value)
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
        Bucket="coterie"
    )
    yield endpoint
    server.stop()


def test_memory_store_on_s3_uri(s3_endpoint: str) -> None:
    options = {"aws_endpoint": s3_endpoint, "allow_http": "true", **KEYS}
    store = MemoryStore("s3://coterie/memory", HashingEmbedder(dim=32), storage_options=options)
    row = store.write_memory("ana", category="work", content="kept in the object store")
    store.ingest("ana", source="doc", text="A paragraph about object storage.")
    # A second store on the same URI (another process, in effect) reads it back.
    again = MemoryStore("s3://coterie/memory", HashingEmbedder(dim=32), storage_options=options)
    hits = again.recall("ana", query="object store")
    assert {h.tag for h in hits} == {f"[memory {row.id}]", "[knowledge doc#0]"}
    assert again.counts("ana") == {"memories": 1, "knowledge": 1, "user_model": 0}


def test_the_embedder_of_a_store_on_s3_is_read_back(s3_endpoint: str) -> None:
    from coterie.runtime.memory.server import recorded_embedder

    options = {"aws_endpoint": s3_endpoint, "allow_http": "true", **KEYS}
    uri = "s3://coterie/recorded"
    assert recorded_embedder(uri, storage_options=options) is None  # nothing written yet
    MemoryStore(uri, HashingEmbedder(dim=32), storage_options=options).write_memory(
        "ana", category="c", content="x"
    )
    assert recorded_embedder(uri, storage_options=options) == ("hashing-32", 32)
