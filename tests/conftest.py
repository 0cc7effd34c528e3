"""Shared fixtures.

Ray is started once per session (``num_cpus=2``); ``RAY_ADDRESS`` joins an
existing cluster instead. Real network model calls are refused: provider API
keys are removed from the environment and tests talk to local servers. A test
marked ``needs("piece")`` is skipped without that piece, or failed in CI
(``tests/external.py``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.external import require

for _var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "EXA_API_KEY"):
    os.environ.pop(_var, None)
# The SDKs must never reach a real endpoint from the tests.
os.environ["OPENAI_BASE_URL"] = "http://127.0.0.1:9/v1"
os.environ["ANTHROPIC_BASE_URL"] = "http://127.0.0.1:9"


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """A Ray cluster for the whole test session."""
    import ray

    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address, namespace="coterie-tests", log_to_driver=False)
        else:
            import socket

            # A known metrics export port: tests read coterie's metrics there.
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            # address="local": always a cluster of its own, never one a
            # killed run left in /tmp/ray/ray_current_cluster.
            ray.init(
                address="local",
                num_cpus=2,
                namespace="coterie-tests",
                include_dashboard=False,
                log_to_driver=False,
                _metrics_export_port=port,
            )
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def ray_metrics_url(ray_session: None) -> str:
    """The Prometheus endpoint of this node's Ray metrics agent."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    (node,) = [n for n in ray.nodes() if n["NodeID"] == node_id]
    return f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"


@pytest.fixture
def spans() -> Iterator[Any]:
    """This process traces into memory while the test runs (content captured);
    the exporter, whose ``get_finished_spans()`` the test reads."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from coterie.runtime import tracing
    from coterie.runtime.config import TracingSettings
    from coterie.runtime.tracing.otel import OtelTracer

    exporter = InMemorySpanExporter()
    tracer = OtelTracer(
        TracingSettings(enabled=True, service_name="t", capture_content=True),
        process="test",
        attributes={},
        exporter=exporter,
    )
    old = tracing.install(tracer)
    try:
        yield exporter
    finally:
        tracing.install(old)
        tracer.shutdown()


@pytest.fixture(scope="session")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real OTLP receiver (Arize Phoenix) for the session; its base URL."""
    from tests.phoenix import running_phoenix

    with running_phoenix(tmp_path_factory.mktemp("phoenix")) as base:
        yield base


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "needs(piece, ...): needs something from outside Python that tests/run.sh "
        "installs (tests/external.py); skipped without it, failed in CI",
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Check what ``@pytest.mark.needs(...)`` names before the test runs."""
    for mark in item.iter_markers("needs"):
        for piece in mark.args:
            require(piece)
