"""The metrics of :mod:`runtime.metrics` through ``ray.util.metrics``.

Each process creates a metric the first time it records it; Ray's metrics
agent on the node exports them (Prometheus text on the node's metrics export
port, and Ray's dashboard), tagged with the process's worker id, so values
from many processes add up in a query.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from coterie.runtime.metrics import METRICS, Meter, Tags

log = logging.getLogger("coterie.metrics")


class RayMeter(Meter):
    """A :class:`~runtime.metrics.Meter` over ``ray.util.metrics``."""

    def __init__(self) -> None:
        self._made: dict[str, Any] = {}
        self._failed: set[str] = set()

    def _metric(self, name: str) -> Any:
        made = self._made.get(name)
        if made is None:
            from ray.util import metrics

            spec = METRICS[name]
            if spec.kind == "counter":
                made = metrics.Counter(name, description=spec.description, tag_keys=spec.tags)
            elif spec.kind == "gauge":
                made = metrics.Gauge(name, description=spec.description, tag_keys=spec.tags)
            else:
                made = metrics.Histogram(
                    name,
                    description=spec.description,
                    boundaries=list(spec.boundaries),
                    tag_keys=spec.tags,
                )
            self._made[name] = made
        return made

    def _put(self, name: str, method: str, value: float, tags: Tags) -> None:
        # A metric that cannot be recorded never fails the work it counts.
        try:
            getattr(self._metric(name), method)(value, tags=dict(tags))
        except Exception:
            if name not in self._failed:
                self._failed.add(name)
                log.exception("metrics: %s could not be recorded (not logged again)", name)

    def count(self, name: str, value: float, tags: Tags) -> None:
        self._put(name, "inc", value, tags)

    def observe(self, name: str, value: float, tags: Tags) -> None:
        self._put(name, "observe", value, tags)

    def gauge(self, name: str, value: float, tags: Tags) -> None:
        self._put(name, "set", value, tags)


@functools.cache
def ray_meter() -> RayMeter:
    """This process's meter (one per process: Ray registers a metric once)."""
    return RayMeter()


__all__ = ["RayMeter", "ray_meter"]
