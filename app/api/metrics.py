"""Prometheus metrics: request latency, labels accepted (or refused), engine lag per project.

The gauges read the store and the snapshot database of whatever ``bind`` is given (the API's
``Service``, or anything with ``store`` and ``db``): this module imports nothing of the API.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any, Protocol

import orjson
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from app.store.archive import SnapshotDB
from app.store.base import Store


class Source(Protocol):
    """What the gauges read: the store and the snapshot database."""

    @property
    def store(self) -> Store: ...

    @property
    def db(self) -> SnapshotDB: ...


MULTIPROCESS_DIR = "PROMETHEUS_MULTIPROC_DIR"
"""Where several API processes keep their counters for each other's scrapes (prometheus_client's
multiprocess mode: set before the processes import it)."""
REGISTRY = CollectorRegistry()
REQUESTS = Histogram(
    "crowdtally_request_seconds",
    "HTTP request latency",
    ["method", "route", "status"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
    registry=REGISTRY,
)
STORE = Histogram(
    "crowdtally_store_seconds",
    "Latency of state-store calls made by the API",
    ["op"],
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1),
    registry=REGISTRY,
)
LABELS = Counter(
    "crowdtally_labels", "Labels received, by outcome", ["project", "outcome"], registry=REGISTRY
)
REFUSED = Counter(
    "crowdtally_blocks_refused",
    "Blocks refused with 429 engine_behind (nothing appended), by kind (labels, gold)",
    ["project", "kind"],
    registry=REGISTRY,
)


class _StoreCollector(Collector):
    def __init__(self) -> None:
        self.service: Source | None = None

    def collect(self) -> Iterator[Any]:
        svc = self.service
        lag = GaugeMetricFamily(
            "crowdtally_engine_lag_entries", "Log entries not yet applied", labels=["project"]
        )
        lag_s = GaugeMetricFamily(
            "crowdtally_engine_lag_seconds",
            "How long the oldest log entry not yet applied has waited, or the entries "
            "waiting would take at the engine's recent pace, whichever is longer",
            labels=["project"],
        )
        end = GaugeMetricFamily("crowdtally_log_position", "Last log position", labels=["project"])
        queue = GaugeMetricFamily(
            "crowdtally_queue_items", "Items that still need labels", labels=["project"]
        )
        steps = CounterMetricFamily(
            "crowdtally_online_steps", "Item updates of the online EM", labels=["project"]
        )
        failed = GaugeMetricFamily(
            "crowdtally_project_failed",
            "1 while the engine cannot apply the project's log (see /readyz)",
            labels=["project"],
        )
        dyadic = GaugeMetricFamily(
            "crowdtally_dyadic_lag_entries",
            "Log entries applied to the posteriors that the dyadic model (predictions) has "
            "not learned yet",
            labels=["project"],
        )
        em = CounterMetricFamily(
            "crowdtally_batch_em_iterations",
            "Batch EM iterations run by refits",
            labels=["project"],
        )
        refit = GaugeMetricFamily(
            "crowdtally_last_refit_adopted",
            "1 if the project's last refit replaced the served model, 0 if it was declined "
            "(its labels too far from the served ones)",
            labels=["project"],
        )
        store_up = GaugeMetricFamily(
            "crowdtally_store_up",
            "1 while the store (Redis, or the embedded SQLite file) answers; the projects' lag "
            "and failure series are absent while it does not",
        )
        reachable = svc is not None and svc.store.ping()
        store_up.add_metric([], 1.0 if reachable else 0.0)
        if svc is not None and reachable:
            errors = svc.store.failed_projects()
            names = svc.store.project_names()
            for name, p in svc.store.progress(names).items():  # (one round trip for all)
                failed.add_metric([name], 1.0 if name in errors else 0.0)
                lag.add_metric([name], max(p.log_end - p.applied, 0))
                lag_s.add_metric([name], p.lag_s)
                end.add_metric([name], p.log_end)
                queue.add_metric([name], p.queue_size)
                if p.globals:
                    g = orjson.loads(p.globals)
                    steps.add_metric([name], g["scalars"][1])
                    em.add_metric([name], g.get("em_iterations", 0))
                    if g.get("last_refit") is not None:
                        refit.add_metric([name], 1.0 if g["last_refit"]["adopted"] else 0.0)
                    if g.get("dyadic_position") is not None:
                        dyadic.add_metric([name], max(g["position"] - g["dyadic_position"], 0))
        age = GaugeMetricFamily(
            "crowdtally_snapshot_age_seconds", "Age of the latest snapshot", labels=["project"]
        )
        size = GaugeMetricFamily(
            "crowdtally_snapshot_bytes", "Size of the latest snapshot", labels=["project"]
        )
        db_up = GaugeMetricFamily(
            "crowdtally_snapshot_db_up",
            "1 while the snapshot database answers; the snapshot series are absent while it "
            "does not",
        )
        if svc is not None:
            infos = svc.db.infos_if_reachable()  # (None: the other series still scraped)
            db_up.add_metric([], 0.0 if infos is None else 1.0)
            latest = {i.project: i for i in infos or []}  # ordered by position
            now = time.time()
            for name, info in latest.items():
                age.add_metric([name], now - info.created_at)
                size.add_metric([name], info.size_bytes)
        yield store_up
        yield db_up
        yield lag
        yield lag_s
        yield end
        yield queue
        yield steps
        yield em
        yield refit
        yield dyadic
        yield failed
        yield age
        yield size


_COLLECTOR = _StoreCollector()
REGISTRY.register(_COLLECTOR)


def bind(service: Source) -> None:
    _COLLECTOR.service = service


def observe(method: str, route: str, status: int, seconds: float) -> None:
    REQUESTS.labels(method, route, str(status)).observe(seconds)


def exposition() -> tuple[bytes, str]:
    """The metrics of this process, or with ``serve --workers N`` (``PROMETHEUS_MULTIPROC_DIR``
    set by the command) the counters and histograms summed over the N processes, beside the
    gauges read from the store (the same from every process)."""
    if not os.environ.get(MULTIPROCESS_DIR):
        return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
    every = CollectorRegistry()
    multiprocess.MultiProcessCollector(every)  # type: ignore[no-untyped-call]
    every.register(_COLLECTOR)
    return generate_latest(every), CONTENT_TYPE_LATEST
