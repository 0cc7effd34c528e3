"""``tracing:`` in ``runtime.yaml``: OpenTelemetry traces over OTLP/HTTP (see
:mod:`coterie.runtime.tracing`; a section of
:class:`~coterie.runtime.config.RuntimeSettings`).

Off by default. The standard variables fill what the file leaves out:
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (the traces URL as it is) or
``OTEL_EXPORTER_OTLP_ENDPOINT`` (a base URL: ``/v1/traces`` is appended),
``OTEL_EXPORTER_OTLP_TRACES_HEADERS`` / ``OTEL_EXPORTER_OTLP_HEADERS``
(``key=value,key=value``), ``OTEL_SERVICE_NAME``; ``OTEL_SDK_DISABLED=true``
turns tracing off whatever the file says. With ``enabled`` left out, an
endpoint in the environment turns tracing on.

The process that starts the runtime resolves these once
(:meth:`TracingSettings.resolved`) and hands the result to every actor, so
a node whose environment differs traces to the same place.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: Where spans go when nothing names an endpoint: a receiver on this machine.
DEFAULT_ENDPOINT = "http://localhost:4318/v1/traces"
DEFAULT_SERVICE_NAME = "coterie"


class TracingSettings(BaseModel):
    """Whether the runtime traces its turns, and where the spans go."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool | None = Field(
        default=None,
        description="true: export traces; false: never; null: when the environment names an "
        "OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)",
    )
    endpoint: str | None = Field(
        default=None,
        description="the OTLP/HTTP traces URL (default: the environment's, else "
        f"{DEFAULT_ENDPOINT})",
    )
    headers: dict[str, str] = Field(
        default_factory=dict,
        description="headers sent with every export (an API key); the environment's "
        "OTEL_EXPORTER_OTLP_HEADERS are added under these",
    )
    service_name: str | None = Field(
        default=None,
        description=f"service.name of the spans (default: OTEL_SERVICE_NAME, else "
        f"{DEFAULT_SERVICE_NAME})",
    )
    capture_content: bool = Field(
        default=False,
        description="put tool arguments and results on execute_tool spans (redacted like the "
        "audit log); off: only names, ids, durations and error kinds",
    )

    @field_validator("endpoint")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        return check_endpoint(value, "endpoint")

    @field_validator("headers")
    @classmethod
    def _header_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not name.strip() or any(c in name for c in ":\r\n "):
                raise ValueError(f"{name!r} is not a header name")
        return value

    @field_validator("service_name")
    @classmethod
    def _service(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("the service name is empty")
        return value

    def resolved(self, environ: Mapping[str, str]) -> TracingSettings:
        """These settings with ``environ``'s standard variables filled in:
        ``enabled`` is true or false, and when true ``endpoint`` and
        ``service_name`` are set. Raises ValueError naming a variable whose
        value is not usable."""
        if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            return self.model_copy(update={"enabled": False})
        traces = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
        base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
        from_env: str | None = None
        if traces:
            from_env = check_endpoint(traces, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        elif base:
            from_env = check_endpoint(base, "OTEL_EXPORTER_OTLP_ENDPOINT").rstrip("/")
            from_env += "/v1/traces"
        enabled = self.enabled if self.enabled is not None else from_env is not None
        if not enabled:
            return self.model_copy(update={"enabled": False})
        headers = {
            **parse_headers(environ.get("OTEL_EXPORTER_OTLP_HEADERS", "")),
            **parse_headers(environ.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "")),
            **self.headers,
        }
        service = self.service_name or environ.get("OTEL_SERVICE_NAME", "").strip()
        return self.model_copy(
            update={
                "enabled": True,
                "endpoint": self.endpoint or from_env or DEFAULT_ENDPOINT,
                "headers": headers,
                "service_name": service or DEFAULT_SERVICE_NAME,
            }
        )


def check_endpoint(value: str, where: str) -> str:
    """``value`` if it is an http(s) URL with a host; ValueError naming ``where``."""
    parts = urlsplit(value.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{where}: {value!r} is not an http:// or https:// URL")
    return value.strip()


def parse_headers(raw: str) -> dict[str, str]:
    """``key=value,key=value`` (values URL-encoded, as the OTLP exporter's
    variables are) as a mapping; pairs without ``=`` are skipped."""
    headers: dict[str, str] = {}
    for pair in raw.split(","):
        name, sep, value = pair.partition("=")
        if sep and name.strip():
            headers[unquote(name.strip()).lower()] = unquote(value.strip())
    return headers


__all__ = ["DEFAULT_ENDPOINT", "DEFAULT_SERVICE_NAME", "TracingSettings", "parse_headers"]
