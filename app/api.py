"""The HTTP API (FastAPI, under /v1). ``create_app`` wires settings, store and engine."""

from __future__ import annotations

import csv
import gc
import io
import logging
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, Literal, cast

import numpy as np
import orjson
from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from pydantic import TypeAdapter, ValidationError

from app import logs, metrics
from app.auth import allows, ensure_admin_key, issue_key, key_hash
from app.dyadic import DyadicSettings, settings_for
from app.engine import EngineLoop
from app.predictions import MAX_PAIRS, PairPredictions, predict_pairs
from app.predictions import warm_up as warm_up_predictions
from app.queue import QueueSettings
from app.runtime import make_engine_loop, open_snapshot_db
from app.schemas import (
    Accepted,
    BoundaryPage,
    DyadicSettingsBody,
    ErrorResponse,
    GoldIn,
    Hyperparameters,
    Item,
    ItemIn,
    ItemLabel,
    ItemPage,
    KeyCreate,
    KeyCreated,
    LabelIn,
    PairIn,
    Predictions,
    Project,
    ProjectCreate,
    ProjectCreated,
    ProjectStats,
    QueueItem,
    QueuePage,
    QueueSettingsBody,
    Snapshot,
    Summary,
    Worker,
    WorkerPage,
)
from app.settings import Settings
from app.snapshots import SnapshotDB, SnapshotInfo, rebuild_store
from app.store import open_store
from app.store.base import (
    KeyRecord,
    ProjectExistsError,
    ProjectRecord,
    Scope,
    Store,
    nominal_config,
)
from app.views import (
    Globals,
    class_priors,
    confusions,
    iso,
    item_slots,
    quality,
    recompute_posterior,
    slot_rows,
)
from core.acquisition import value_of_information
from core.nominal import NominalConfig

log = logging.getLogger("crowdtally.api")
access = logging.getLogger("crowdtally.access")
CACHE_S = 1.0
_LABELS = TypeAdapter(list[LabelIn])
_GOLD = TypeAdapter(list[GoldIn])
_ITEMS = TypeAdapter(list[ItemIn])
_PAIRS = TypeAdapter(list[PairIn])
_ERRORS: dict[int | str, dict[str, Any]] = {
    s: {"model": ErrorResponse} for s in (400, 401, 403, 404, 409, 413, 422)
}


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        entry: int | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.entry, self.field = (
            status,
            code,
            message,
            entry,
            field,
        )

    def response(self) -> JSONResponse:
        body = {
            "code": self.code,
            "message": self.message,
            "entry": self.entry,
            "field": self.field,
        }
        return JSONResponse({"error": body}, status_code=self.status)


class Service:
    """What the routes share: settings, the store, the in-process engine (if any)."""

    def __init__(
        self, settings: Settings, store: Store, engine: EngineLoop | None, db: SnapshotDB
    ) -> None:
        self.settings = settings
        self.store = store
        self.engine = engine
        self.db = db
        self._configs: dict[tuple[str, float], NominalConfig] = {}
        self._dyadic: dict[tuple[str, float], DyadicSettings | None] = {}
        self._cache: dict[tuple[str, str], tuple[float, Any]] = {}

    def project(self, name: str) -> ProjectRecord:
        record: ProjectRecord | None = self._cached(
            ("project", name), lambda: self.store.get_project(name)
        )
        if record is None:
            raise ApiError(404, "unknown_project", f"no project named {name!r}")
        return record

    def key(self, key_hash: str) -> KeyRecord | None:
        record: KeyRecord | None = self._cached(
            ("key", key_hash), lambda: self.store.get_key(key_hash)
        )
        return record

    def forget(self) -> None:
        """Drop the cache (a project deleted through this process is gone at once)."""
        self._cache.clear()

    def _cached(self, what: tuple[str, str], load: Callable[[], Any]) -> Any:
        # Keys and project records change rarely and cost a store round trip each on every
        # request; each API process keeps them for CACHE_S (a deletion made through another
        # process takes effect there within that time).
        now = time.monotonic()
        hit = self._cache.get(what)
        if hit is not None and now - hit[0] < CACHE_S:
            return hit[1]
        value = load()
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[what] = (now, value)
        return value

    def config(self, record: ProjectRecord) -> NominalConfig:
        key = (record.name, record.created_at)
        cfg = self._configs.get(key)
        if cfg is None:
            cfg = self._configs[key] = nominal_config(record)
        return cfg

    def dyadic(self, record: ProjectRecord) -> DyadicSettings:
        """The project's dyadic settings; 409 when the project has no dyadic model."""
        key = (record.name, record.created_at)
        if key not in self._dyadic:
            self._dyadic[key] = DyadicSettings.of(record.config)
        settings = self._dyadic[key]
        if settings is None:
            raise ApiError(409, "dyadic_disabled", f"project {record.name!r} has no dyadic model")
        return settings


def _service(request: Request) -> Service:
    svc: Service = request.app.state.service
    return svc


def _key_of(request: Request) -> str | None:
    auth = request.headers.get("authorization")
    if auth and auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key")


def _authorize(request: Request, scope: Scope, project: str | None) -> KeyRecord:
    key = _key_of(request)
    if not key:
        raise ApiError(401, "missing_key", "send an API key: 'Authorization: Bearer <key>'")
    record = _service(request).key(key_hash(key))
    if record is None:
        raise ApiError(401, "invalid_key", "the API key is not known")
    if not allows(record, scope, project):
        what = "admin endpoints" if project is None else f"{scope} access to project {project!r}"
        raise ApiError(403, "forbidden", f"this key (scope {record.scope}) does not allow {what}")
    return record


def require(scope: Scope, per_project: bool = True) -> Any:
    async def dependency(request: Request) -> KeyRecord:
        # async: a key look-up is one fast store read, cheaper inline than a thread hop
        project = request.path_params.get("project") if per_project else None
        return _authorize(request, scope, project)

    return Depends(dependency)


def _project_view(svc: Service, record: ProjectRecord) -> dict[str, Any]:
    cfg = dict(record.config)
    slots = cfg.pop("n_worker_slots")
    cfg.pop("n_classes")
    dyadic = DyadicSettings.of(record.config)
    hyper = {k: v for k, v in cfg.items() if k in Hyperparameters.model_fields}
    g = Globals.parse(svc.store.get_params(record.name, [])[0], svc.config(record))
    log_end, applied = svc.store.log_end(record.name), svc.store.applied_position(record.name)
    return {
        "name": record.name,
        "labels": list(record.labels),
        "hyperparameters": hyper,
        "worker_slots": slots,
        "dyadic": _dyadic_view(dyadic),
        "created_at": iso(record.created_at),
        "stats": ProjectStats(
            log_end=log_end,
            applied=applied,
            lag=max(log_end - applied, 0),
            n_items=g.n_items,
            n_workers=g.n_workers,
            n_labels=g.n_labels,
            dyadic_passes=g.dyadic_examples / g.n_labels if dyadic and g.n_labels else None,
        ),
    }


def _dyadic_view(settings: DyadicSettings | None) -> DyadicSettingsBody:
    if settings is None:
        return DyadicSettingsBody(enabled=False)
    c = settings.config
    return DyadicSettingsBody(
        k=c.k, loss=c.loss, reduction=c.reduction, ordinal=c.ordinal, eta=c.eta, l2=c.l2,
        dyadic_rate=c.dyadic_rate, passes=settings.passes, rater_slots=c.rater_slots, task_slots=c.task_slots,
    )  # fmt: skip


def _dyadic_settings(body: DyadicSettingsBody, n_classes: int) -> dict[str, Any] | None:
    if not body.enabled:
        return None
    fields = body.model_dump(exclude={"enabled"})
    try:
        return settings_for(n_classes, **fields).to_dict()
    except ValueError as exc:
        raise ApiError(422, "invalid_dyadic", str(exc), None, "dyadic") from None


def _predictions(
    record: ProjectRecord,
    workers: list[str],
    items: list[str],
    p: PairPredictions,
    order: list[int] | None = None,
) -> list[dict[str, Any]]:
    """The answer's rows (plain dicts: the response model validates them once), in ``order``."""
    classes = record.labels
    labels, scores, h, trained = p.labels.tolist(), p.scores.tolist(), p.h_min, p.trained
    return [
        {
            "worker": workers[n],
            "item": items[n],
            "label": classes[labels[n]],
            "scores": dict(zip(classes, scores[n], strict=True)),
            "h_min": float(h[n]) if np.isfinite(h[n]) else None,
            "trained": bool(trained[n]),
        }
        for n in (range(len(workers)) if order is None else order)
    ]


def _nearest_boundary(
    workers: list[str], items: list[str], p: PairPredictions, limit: int
) -> list[int]:
    """The ``limit`` smallest h_min first (inf: cannot flip, last); ties by worker, item."""
    h = p.h_min.tolist()
    return sorted(range(len(h)), key=lambda n: (h[n], workers[n], items[n]))[:limit]


def _parse_block(
    raw: bytes, adapter: TypeAdapter[Any], limit: int, what: str = "label"
) -> list[Any]:
    if len(raw) > limit * 2048:
        raise ApiError(
            413, "block_too_large", f"a {len(raw):,}-byte body; blocks hold at most {limit} {what}s"
        )
    try:  # the common case in one pass over the bytes; errors are explained below
        fast: list[Any] = adapter.validate_json(raw)
        if 0 < len(fast) <= limit:
            return fast
    except ValidationError:
        pass
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, "invalid_json", f"the body is not JSON: {exc}") from None
    if not isinstance(data, list):
        raise ApiError(422, "invalid_block", f"the body must be a JSON array of {what}s")
    if not data:
        raise ApiError(422, "empty_block", f"the block holds no {what}s")
    if len(data) > limit:
        raise ApiError(
            413, "block_too_large", f"{len(data)} {what}s in one block; the limit is {limit}"
        )
    try:
        out: list[Any] = adapter.validate_python(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [x for x in err["loc"] if not isinstance(x, str) or x != "body"]
        entry = loc[0] if loc and isinstance(loc[0], int) else None
        field = ".".join(str(x) for x in loc[1:]) or None
        n_bad = exc.error_count()
        more = f" ({n_bad - 1} more errors)" if n_bad > 1 else ""
        raise ApiError(
            422,
            f"invalid_{what}",
            f"entry {entry}, field {field!r}: {err['msg']}{more}",
            entry,
            field,
        ) from None
    return out


def _array_body(schema: str) -> dict[str, Any]:
    """OpenAPI for a body read by hand (``_parse_block``): a JSON array of ``schema``."""
    items = {"$ref": f"#/components/schemas/{schema}"}
    content = {"application/json": {"schema": {"type": "array", "items": items}}}
    return {"requestBody": {"required": True, "content": content}}


def _label_codes(record: ProjectRecord, names: list[str]) -> list[int]:
    index = {name: k for k, name in enumerate(record.labels)}
    codes = [index.get(n, -1) for n in names]
    if -1 in codes:
        bad = codes.index(-1)
        raise ApiError(
            422,
            "unknown_label",
            f"entry {bad}, field 'label': {names[bad]!r} is not one of {list(record.labels)}",
            bad,
            "label",
        )
    return codes


def _wait_applied(svc: Service, project: str, position: int) -> bool:
    if svc.engine is not None:
        svc.engine.wake()
    deadline = time.monotonic() + svc.settings.wait_timeout_s
    while svc.store.applied_position(project) < position:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


def _item_view(
    svc: Service, record: ProjectRecord, item: str, blob: bytes, with_labels: bool, fresh: bool
) -> Item:
    d = orjson.loads(blob)
    cfg = svc.config(record)
    if fresh:
        slots, local = item_slots(d, cfg.n_worker_slots)
        gblob, rows = svc.store.get_params(record.name, slots)
        g = Globals.parse(gblob, cfg)
        posterior = recompute_posterior(cfg, d, g, rows, local)
        computed_at, position = time.time(), g.position
    else:
        posterior = np.asarray(d["posterior"])
        computed_at, position = d["computed_at"], d["position"]
    best = int(posterior.argmax())
    classes = record.labels
    return Item(
        item=item,
        label=classes[best],
        probability=float(posterior[best]),
        posterior={c: float(p) for c, p in zip(classes, posterior.tolist(), strict=True)},
        n_labels=len(d["labels"]),
        gold=classes[d["gold"]] if d.get("gold") is not None else None,
        labels=[ItemLabel(worker=w, label=classes[z], weight=x) for w, z, x in d["labels"]]
        if with_labels
        else None,
        computed_at=iso(computed_at),
        position=position,
    )


def _workers_view(
    svc: Service, record: ProjectRecord, entries: list[tuple[str, bytes]], with_confusion: bool
) -> list[Worker]:
    if not entries:
        return []
    cfg = svc.config(record)
    stats = [orjson.loads(b) for _, b in entries]
    slots = [s["slot"] for s in stats]
    uniq = sorted(set(slots))
    gblob, rows = svc.store.get_params(record.name, uniq)
    g = Globals.parse(gblob, cfg)
    conf_u = confusions(g, slot_rows(rows, cfg.n_classes))
    conf = conf_u[np.searchsorted(uniq, slots)]
    acc, info = quality(conf, class_priors(g))
    classes = record.labels
    out = []
    for n, ((name, _), s) in enumerate(zip(entries, stats, strict=True)):
        matrix = (
            {
                t: dict(zip(classes, row, strict=True))
                for t, row in zip(classes, conf[n].tolist(), strict=True)
            }
            if with_confusion
            else None
        )
        out.append(
            Worker(
                worker=name,
                accuracy=float(acc[n]),
                informativeness=float(info[n]),
                confusion=matrix,
                n_labels=s["n_labels"],
                gold_labels=s["gold_seen"],
                gold_accuracy=s["gold_right"] / s["gold_seen"] if s["gold_seen"] else None,
                slot=s["slot"],
                computed_at=iso(g.computed_at),
            )
        )
    return out


def _request_id(scope: Any) -> str:
    """The caller's X-Request-ID (if sane), else a new one."""
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id" and 0 < len(value) <= 128:
            return str(value.decode("latin-1"))
    return uuid.uuid4().hex[:16]


class TimedStore:
    """The store, with each call's latency in ``crowdtally_store_seconds{op}``."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr
        hist = metrics.STORE.labels(name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                hist.observe(time.perf_counter() - t0)

        return timed


class _Observe:
    """Request latency into Prometheus, as plain ASGI (no extra task per request)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = [500]
        rid = _request_id(scope)
        token = logs.request_id.set(rid)

        async def send_status(message: Any) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message.setdefault("headers", []).append((b"x-request-id", rid.encode()))
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            seconds = time.perf_counter() - t0
            metrics.observe(scope["method"], route, status[0], seconds)
            access.info(
                "request",
                extra={"method": scope["method"], "path": scope["path"], "route": route,
                       "status": status[0], "ms": round(1000 * seconds, 3)},
            )  # fmt: skip
            logs.request_id.reset(token)


def _warm_up() -> None:
    """Load the compiled kernels now, not on the first GET (a ~0.2 s stall under load)."""
    cfg = NominalConfig(n_classes=2, n_worker_slots=1)
    item = {"labels": [["w", 0, 1.0]], "gold": None}
    recompute_posterior(cfg, item, Globals.parse(None, cfg), [None], [0])
    warm_up_predictions()


def _queue_settings(svc: Service, project: str) -> QueueSettings:
    blob = svc.store.queue_settings(project)
    return QueueSettings(**orjson.loads(blob)) if blob else QueueSettings()


def _queue_for(
    svc: Service, record: ProjectRecord, settings: QueueSettings, limit: int, worker: str | None
) -> list[QueueItem]:
    classes = record.labels
    want = limit if worker is None else max(5 * limit, 50)
    while True:
        top = svc.store.read_queue(record.name, want)
        blobs = svc.store.get_items(record.name, [name for name, _ in top])
        rows = [
            (name, score, orjson.loads(b)) for (name, score), b in zip(top, blobs, strict=True) if b
        ]
        if worker is not None:
            rows = [r for r in rows if all(w != worker for w, _, _ in r[2]["labels"])]
        if len(rows) >= limit or len(top) < want:
            break
        want *= 4  # this worker labelled many of the best: look further down
    if worker is not None and settings.policy == "voi" and rows:
        stats = svc.store.get_worker(record.name, worker)
        if stats is not None:  # rank by what this worker's answer would tell
            cfg = svc.config(record)
            slot = orjson.loads(stats)["slot"]
            gblob, row = svc.store.get_params(record.name, [slot])
            conf = confusions(Globals.parse(gblob, cfg), slot_rows(row, cfg.n_classes))[0]
            q = np.array([r[2]["posterior"] for r in rows])
            own = value_of_information(q, conf)
            order = np.argsort(-own, kind="stable")
            rows = [(rows[i][0], float(own[i]), rows[i][2]) for i in order.tolist()]
    out = []
    for name, score, d in rows[:limit]:
        q = d["posterior"]
        best = int(np.argmax(q))
        out.append(
            QueueItem(
                item=name,
                score=score,
                label=classes[best],
                probability=q[best],
                n_labels=len(d["labels"]),
            )
        )
    return out


def _boundary_workers(
    svc: Service, project: str, item: str, candidates: int
) -> tuple[list[str], list[str]]:
    """(items, workers) pairs of ``item`` with the workers who have not labelled it, the
    ``candidates`` with the most labels first."""
    blob = svc.store.get_item(project, item)
    done = {w for w, _, _ in orjson.loads(blob)["labels"]} if blob else set()
    ranked = sorted(
        ((-orjson.loads(b)["n_labels"], w) for w, b in svc.store.all_workers(project)
         if w not in done)
    )  # fmt: skip
    workers = [w for _, w in ranked[:candidates]]
    return [item] * len(workers), workers


DASHBOARD = Path(__file__).with_name("dashboard")
SPAMMER_INFORMATIVENESS = 0.1


def _summary(svc: Service, record: ProjectRecord, n_workers: int) -> dict[str, Any]:
    K = len(record.labels)
    top = []
    best = np.zeros(K, dtype=np.int64)
    cursor = 0
    while True:  # stored posteriors, page by page
        cursor, page = svc.store.scan_items(record.name, cursor, 2000)
        if page:
            q = np.array([orjson.loads(b)["posterior"] for _, b in page])
            top.append(q.max(axis=1))
            best += np.bincount(q.argmax(axis=1), minlength=K)
        if cursor == 0:
            break
    edges = np.linspace(0.0, 1.0, 21)
    counts = np.histogram(np.concatenate(top) if top else np.zeros(0), bins=edges)[0]
    views = _workers_view(svc, record, svc.store.all_workers(record.name), with_confusion=True)
    views.sort(key=lambda w: (w.informativeness, -w.n_labels, w.worker))
    view = _project_view(svc, record)
    settings = _queue_settings(svc, record.name)
    return {
        "queue": _queue_for(svc, record, settings, 10, None),
        "queue_size": svc.store.queue_size(record.name),
        "project": record.name,
        "labels": list(record.labels),
        "stats": view["stats"],
        "confidence_histogram": {"edges": edges.tolist(), "counts": counts.tolist()},
        "label_counts": dict(zip(record.labels, best.tolist(), strict=True)),
        "workers": [
            {**w.model_dump(), "likely_spammer": w.informativeness < SPAMMER_INFORMATIVENESS}
            for w in views[:n_workers]
        ],
        "computed_at": iso(time.time()),
    }


def _snapshot_view(info: SnapshotInfo) -> dict[str, Any]:
    return {
        **info.as_dict(),
        "created_at": iso(info.created_at),
        "age_s": time.time() - info.created_at,
    }


def create_app(settings: Settings | None = None, store: Store | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        st = store if store is not None else open_store(settings)
        key_file = settings.data_dir / "admin.key" if settings.store == "embedded" else None
        made = ensure_admin_key(st, settings.admin_key, key_file)
        if made:
            where = f" (saved in {key_file})" if key_file else ""
            print(
                f"crowdtally: created the admin API key{where}: {made}", file=sys.stderr, flush=True
            )
        db = open_snapshot_db(settings)
        rebuilt = rebuild_store(st, db)
        if rebuilt:
            print(f"crowdtally: rebuilt {rebuilt} from the SQL snapshots", file=sys.stderr)
        made = ensure_admin_key(st, settings.admin_key, key_file)
        if made:
            where = f" (saved in {key_file})" if key_file else ""
            print(
                f"crowdtally: created the admin API key{where}: {made}", file=sys.stderr, flush=True
            )
        engine = None
        if settings.engine_in_process:
            engine = make_engine_loop(settings, st, db)
            engine.start()
        app.state.service = Service(settings, cast(Store, TimedStore(st)), engine, db)
        _warm_up()
        # numba and llvmlite bring ~10^6 long-lived objects; a full GC pass over them stalls
        # requests for ~0.1 s. Freeze them out of the collector's sight.
        gc.collect()
        gc.freeze()
        metrics.bind(app.state.service)
        try:
            yield
        finally:
            if engine is not None:
                engine.stop()
                if engine.snapshotter is not None:
                    engine.snapshotter.close()
            if store is None:
                st.close()

    app = FastAPI(
        title="crowdtally",
        version="0.1.0",
        summary="Live label aggregation for crowdsourcing: posteriors, worker quality, queues.",
        lifespan=lifespan,
    )

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        err = exc.errors()[0]
        field = ".".join(str(x) for x in err["loc"][1:]) or None
        return ApiError(422, "invalid_request", f"{field}: {err['msg']}", None, field).response()

    app.add_middleware(_Observe)

    # ------------------------------------------------------------------ operations
    @app.get("/healthz", operation_id="healthz", tags=["operations"])
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", operation_id="readyz", tags=["operations"])
    def readyz(request: Request) -> JSONResponse:
        svc = _service(request)
        ok = svc.store.ping()
        lag = (
            {
                r.name: svc.store.log_end(r.name) - svc.store.applied_position(r.name)
                for r in svc.store.list_projects()
            }
            if ok
            else {}
        )
        engine_error = svc.engine.last_error if svc.engine else None
        snap = svc.engine.snapshotter if svc.engine else None
        snapshot_error = snap.last_error if snap else None
        now = time.time()
        ages: dict[str, float] = {}
        for info in svc.db.infos():
            ages[info.project] = now - info.created_at
        ready = ok and engine_error is None and snapshot_error is None
        body = {
            "ready": ready,
            "store": "ok" if ok else "unreachable",
            "engine_lag": lag,
            "engine_error": engine_error,
            "snapshot_age_s": ages,
            "snapshot_error": snapshot_error,
        }
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get(
        "/metrics", operation_id="metrics", tags=["operations"], response_class=PlainTextResponse
    )
    def metrics_endpoint() -> Response:
        data, content_type = metrics.exposition()
        return Response(data, media_type=content_type)

    # ------------------------------------------------------------------ projects
    @app.post(
        "/v1/projects",
        status_code=201,
        operation_id="create_project",
        tags=["projects"],
        response_model=ProjectCreated,
        responses=_ERRORS,
        dependencies=[require("admin", per_project=False)],
    )
    def create_project(body: ProjectCreate, request: Request) -> dict[str, Any]:
        svc = _service(request)
        hyper = body.hyperparameters.model_dump()
        if hyper["class_prior"] is not None:
            hyper["class_prior"] = tuple(hyper["class_prior"])
        try:
            cfg = NominalConfig(
                n_classes=len(body.labels), n_worker_slots=body.worker_slots, **hyper
            )
        except ValueError as exc:
            raise ApiError(
                422, "invalid_hyperparameters", str(exc), None, "hyperparameters"
            ) from None
        config: dict[str, Any] = cfg.to_dict()
        config["dyadic"] = _dyadic_settings(body.dyadic, len(body.labels))
        record = ProjectRecord(body.name, tuple(body.labels), config, time.time())
        try:
            svc.store.create_project(record)
        except ProjectExistsError:
            raise ApiError(409, "project_exists", f"a project named {body.name!r} exists") from None
        svc.forget()  # a cached "no such project" must not outlive its creation
        key, _ = issue_key(svc.store, "write", body.name)
        return {**_project_view(svc, record), "api_key": key}

    @app.get(
        "/v1/projects",
        operation_id="list_projects",
        tags=["projects"],
        response_model=list[Project],
        responses=_ERRORS,
        dependencies=[require("admin", per_project=False)],
    )
    def list_projects(request: Request) -> list[dict[str, Any]]:
        svc = _service(request)
        return [_project_view(svc, r) for r in svc.store.list_projects()]

    @app.get(
        "/v1/projects/{project}",
        operation_id="get_project",
        tags=["projects"],
        response_model=Project,
        responses=_ERRORS,
        dependencies=[require("read")],
    )
    def get_project(project: str, request: Request) -> dict[str, Any]:
        svc = _service(request)
        return _project_view(svc, svc.project(project))

    @app.delete(
        "/v1/projects/{project}",
        status_code=204,
        operation_id="delete_project",
        tags=["projects"],
        responses=_ERRORS,
        dependencies=[require("admin")],
    )
    def delete_project(project: str, request: Request) -> Response:
        svc = _service(request)
        if not svc.store.delete_project(project):
            raise ApiError(404, "unknown_project", f"no project named {project!r}")
        svc.db.forget_project(project)  # snapshots and archive go too
        svc.forget()
        return Response(status_code=204)

    @app.post(
        "/v1/projects/{project}/keys",
        status_code=201,
        operation_id="create_key",
        tags=["projects"],
        response_model=KeyCreated,
        responses=_ERRORS,
        dependencies=[require("admin")],
    )
    def create_key(project: str, body: KeyCreate, request: Request) -> KeyCreated:
        svc = _service(request)
        svc.project(project)
        key, rec = issue_key(svc.store, body.scope, project)
        return KeyCreated(api_key=key, key_id=rec.key_id, scope=rec.scope, project=project)

    # ------------------------------------------------------------------ labels
    @app.post(
        "/v1/projects/{project}/labels",
        status_code=202,
        operation_id="post_labels",
        tags=["labels"],
        response_model=Accepted,
        responses={**_ERRORS, 413: {"model": ErrorResponse}},
        dependencies=[require("write")],
        openapi_extra=_array_body("LabelIn"),
    )
    async def post_labels(project: str, request: Request, wait: bool = False) -> Accepted:
        svc = _service(request)
        record = svc.project(project)
        labels: list[LabelIn] = _parse_block(
            await request.body(), _LABELS, svc.settings.max_block_labels
        )
        codes = _label_codes(record, [x.label for x in labels])
        weights = [x.weight for x in labels]
        ids = [x.id for x in labels]
        payload = orjson.dumps(
            {
                "items": [x.item for x in labels],
                "workers": [x.worker for x in labels],
                "labels": codes,
                "weights": None if all(w == 1.0 for w in weights) else weights,
                "ids": ids,  # kept in the archive: a wiped Redis gets its seen ids back
            }
        )
        result = await _in_thread(svc.store.append, project, "labels", payload, ids)
        metrics.LABELS.labels(project, "accepted").inc(result.accepted)
        metrics.LABELS.labels(project, "duplicate").inc(result.duplicates)
        applied = await _in_thread(_wait_applied, svc, project, result.position) if wait else False
        if svc.engine is not None:
            svc.engine.wake()
        return Accepted(
            accepted=result.accepted,
            duplicates=result.duplicates,
            position=result.position,
            applied=applied,
        )

    @app.post(
        "/v1/projects/{project}/gold",
        status_code=202,
        operation_id="post_gold",
        tags=["labels"],
        response_model=Accepted,
        responses=_ERRORS,
        dependencies=[require("write")],
        openapi_extra=_array_body("GoldIn"),
    )
    async def post_gold(project: str, request: Request, wait: bool = False) -> Accepted:
        svc = _service(request)
        record = svc.project(project)
        gold: list[GoldIn] = _parse_block(
            await request.body(), _GOLD, svc.settings.max_block_labels
        )
        codes = _label_codes(record, [x.label for x in gold])
        payload = orjson.dumps({"items": [x.item for x in gold], "labels": codes})
        result = await _in_thread(svc.store.append, project, "gold", payload, None)
        applied = await _in_thread(_wait_applied, svc, project, result.position) if wait else False
        return Accepted(accepted=len(gold), duplicates=0, position=result.position, applied=applied)

    @app.post(
        "/v1/projects/{project}/refit",
        status_code=202,
        operation_id="refit",
        tags=["labels"],
        response_model=Accepted,
        responses=_ERRORS,
        dependencies=[require("write")],
    )
    def refit(project: str, request: Request, wait: bool = False) -> Accepted:
        svc = _service(request)
        svc.project(project)
        result = svc.store.append(project, "refit", b"{}", None)
        applied = _wait_applied(svc, project, result.position) if wait else False
        return Accepted(accepted=0, duplicates=0, position=result.position, applied=applied)

    # ------------------------------------------------------------------ snapshots
    @app.get(
        "/v1/projects/{project}/snapshots",
        operation_id="list_snapshots",
        tags=["snapshots"],
        response_model=list[Snapshot],
        responses=_ERRORS,
        dependencies=[require("read")],
    )
    def list_snapshots(project: str, request: Request) -> list[dict[str, Any]]:
        svc = _service(request)
        svc.project(project)
        return [_snapshot_view(i) for i in svc.db.infos(project)]

    @app.post(
        "/v1/projects/{project}/snapshots",
        status_code=202,
        operation_id="take_snapshot",
        tags=["snapshots"],
        response_model=Accepted,
        responses=_ERRORS,
        dependencies=[require("write")],
    )
    def take_snapshot(project: str, request: Request, wait: bool = False) -> Accepted:
        """Ask the engine for a snapshot at the current end of the log."""
        svc = _service(request)
        svc.project(project)
        result = svc.store.append(project, "snapshot", b"{}", None)
        applied = _wait_applied(svc, project, result.position) if wait else False
        if applied:
            deadline = time.monotonic() + svc.settings.wait_timeout_s
            while not any(i.position >= result.position for i in svc.db.infos(project)):
                if time.monotonic() > deadline:
                    applied = False
                    break
                time.sleep(0.01)
        return Accepted(accepted=0, duplicates=0, position=result.position, applied=applied)

    @app.get(
        "/v1/projects/{project}/snapshots/{snapshot_id}",
        operation_id="get_snapshot",
        tags=["snapshots"],
        response_model=Snapshot,
        responses=_ERRORS,
        dependencies=[require("read")],
    )
    def get_snapshot(project: str, snapshot_id: int, request: Request) -> dict[str, Any]:
        svc = _service(request)
        found = [i for i in svc.db.infos(project) if i.id == snapshot_id]
        if not found:
            raise ApiError(
                404, "unknown_snapshot", f"project {project!r} has no snapshot {snapshot_id}"
            )
        return _snapshot_view(found[0])

    @app.delete(
        "/v1/projects/{project}/snapshots/{snapshot_id}",
        status_code=204,
        operation_id="delete_snapshot",
        tags=["snapshots"],
        responses=_ERRORS,
        dependencies=[require("admin")],
    )
    def delete_snapshot(project: str, snapshot_id: int, request: Request) -> Response:
        svc = _service(request)
        if not any(i.id == snapshot_id for i in svc.db.infos(project)) or not svc.db.delete(
            snapshot_id
        ):
            raise ApiError(
                404, "unknown_snapshot", f"project {project!r} has no snapshot {snapshot_id}"
            )
        return Response(status_code=204)

    # ------------------------------------------------------------------ items
    @app.get(
        "/v1/projects/{project}/items/{item:path}",
        operation_id="get_item",
        tags=["items"],
        response_model=Item,
        responses=_ERRORS,
        dependencies=[require("read")],
    )
    async def get_item(project: str, item: str, request: Request) -> Item:
        svc = _service(request)
        record = svc.project(project)
        blob = svc.store.get_item(project, item)
        if blob is None:
            raise ApiError(
                404, "unknown_item", f"no labels for item {item!r} have been applied yet"
            )
        return _item_view(svc, record, item, blob, with_labels=True, fresh=True)

    @app.get(
        "/v1/projects/{project}/items",
        operation_id="list_items",
        tags=["items"],
        response_model=ItemPage,
        responses=_ERRORS,
        dependencies=[require("read")],
    )
    def list_items(
        project: str,
        request: Request,
        cursor: str | None = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        max_probability: Annotated[float, Query(ge=0, le=1)] = 1.0,
        min_probability: Annotated[float, Query(ge=0, le=1)] = 0.0,
    ) -> ItemPage:
        svc = _service(request)
        record = svc.project(project)
        try:
            pos = int(cursor) if cursor else 0
        except ValueError:
            raise ApiError(
                422,
                "invalid_cursor",
                "cursor must be a value returned as next_cursor",
                None,
                "cursor",
            ) from None
        nxt, page = svc.store.scan_items(project, pos, limit)
        items = [_item_view(svc, record, k, b, with_labels=False, fresh=False) for k, b in page]
        items = [x for x in items if min_probability <= x.probability <= max_probability]
        return ItemPage(items=items, next_cursor=str(nxt) if nxt else None)

    @app.get(
        "/v1/projects/{project}/export",
        operation_id="export_items",
        tags=["items"],
        responses=_ERRORS,
        dependencies=[require("read")],
    )
    def export_items(
        project: str, request: Request, format: Literal["jsonl", "csv"] = "jsonl"
    ) -> StreamingResponse:
        svc = _service(request)
        record = svc.project(project)

        def pages() -> Iterator[list[Item]]:
            cursor = 0
            while True:
                cursor, page = svc.store.scan_items(project, cursor, 1000)
                yield [
                    _item_view(svc, record, k, b, with_labels=False, fresh=False) for k, b in page
                ]
                if cursor == 0:
                    return

        def jsonl() -> Iterator[bytes]:
            for page in pages():
                yield b"".join(orjson.dumps(x.model_dump(exclude={"labels"})) + b"\n" for x in page)

        def csv_rows() -> Iterator[str]:
            buf = io.StringIO()
            w = csv.writer(buf)
            w.writerow(
                ["item", "label", "probability", *record.labels, "n_labels", "gold", "computed_at"]
            )
            for page in pages():
                for x in page:
                    w.writerow(
                        [
                            x.item,
                            x.label,
                            f"{x.probability:.6g}",
                            *(f"{x.posterior[c]:.6g}" for c in record.labels),
                            x.n_labels,
                            x.gold or "",
                            x.computed_at,
                        ]
                    )
                yield buf.getvalue()
                buf.seek(0)
                buf.truncate()

        if format == "csv":
            return StreamingResponse(csv_rows(), media_type="text/csv")
        return StreamingResponse(jsonl(), media_type="application/x-ndjson")

    # ------------------------------------------------------------------ queue
    @app.post(
        "/v1/projects/{project}/items",
        status_code=202,
        operation_id="register_items",
        tags=["queue"],
        response_model=Accepted,
        responses=_ERRORS,
        dependencies=[require("write")],
        openapi_extra=_array_body("ItemIn"),
    )
    async def register_items(project: str, request: Request, wait: bool = False) -> Accepted:
        """Items with no labels yet: they enter the queue."""
        svc = _service(request)
        svc.project(project)
        items: list[ItemIn] = _parse_block(
            await request.body(), _ITEMS, svc.settings.max_block_labels
        )
        payload = orjson.dumps({"items": [x.item for x in items]})
        result = await _in_thread(svc.store.append, project, "items", payload, None)
        applied = await _in_thread(_wait_applied, svc, project, result.position) if wait else False
        return Accepted(
            accepted=len(items), duplicates=0, position=result.position, applied=applied
        )

    @app.get(
        "/v1/projects/{project}/queue/settings",
        operation_id="get_queue_settings",
        tags=["queue"],
        response_model=QueueSettingsBody,
        responses=_ERRORS,
        dependencies=[require("read")],
    )
    def get_queue_settings(project: str, request: Request) -> dict[str, Any]:
        svc = _service(request)
        svc.project(project)
        return _queue_settings(svc, project).to_dict()

    @app.put(
        "/v1/projects/{project}/queue/settings",
        status_code=202,
        operation_id="set_queue_settings",
        tags=["queue"],
        response_model=Accepted,
        responses=_ERRORS,
        dependencies=[require("write")],
    )
    def set_queue_settings(
        project: str, body: QueueSettingsBody, request: Request, wait: bool = False
    ) -> Accepted:
        svc = _service(request)
        svc.project(project)
        payload = orjson.dumps({"queue": body.model_dump()})
        result = svc.store.append(project, "settings", payload, None)
        applied = _wait_applied(svc, project, result.position) if wait else False
        return Accepted(accepted=1, duplicates=0, position=result.position, applied=applied)

    @app.get(
        "/v1/projects/{project}/queue",
        operation_id="get_queue",
        tags=["queue"],
        response_model=QueuePage,
        responses=_ERRORS,
        dependencies=[require("read")],
    )
    def get_queue(
        project: str,
        request: Request,
        limit: Annotated[int, Query(ge=1, le=1000)] = 10,
        worker: Annotated[str | None, Query(min_length=1, max_length=512)] = None,
    ) -> QueuePage:
        """The items to label next, best first; finished items never appear. With ``worker``:
        not the items this worker labelled, ranked by the worker's own confusion (voi)."""
        svc = _service(request)
        record = svc.project(project)
        settings = _queue_settings(svc, project)
        items = _queue_for(svc, record, settings, limit, worker)
        return QueuePage(
            items=items, size=svc.store.queue_size(project), policy=settings.policy, worker=worker
        )

    # ------------------------------------------------------------------ predictions
    @app.post(
        "/v1/projects/{project}/predictions",
        operation_id="predict",
        tags=["predictions"],
        response_model=Predictions,
        responses={**_ERRORS, 413: {"model": ErrorResponse}},
        dependencies=[require("read")],
        openapi_extra=_array_body("PairIn"),
    )
    async def predict(project: str, request: Request) -> dict[str, Any]:
        """The label each worker would give each item (the dyadic model), with per-label
        scores and h_min, for a JSON array of ``{worker, item}`` (at most 10,000)."""
        svc = _service(request)
        record = svc.project(project)
        settings = svc.dyadic(record)
        pairs: list[PairIn] = _parse_block(await request.body(), _PAIRS, MAX_PAIRS, "pair")
        workers, items = [x.worker for x in pairs], [x.item for x in pairs]
        p = await _in_thread(predict_pairs, svc.store, project, settings, workers, items)
        return {"predictions": _predictions(record, workers, items, p), "position": p.position}

    @app.get(
        "/v1/projects/{project}/boundary",
        operation_id="nearest_boundary",
        tags=["predictions"],
        response_model=BoundaryPage,
        responses=_ERRORS,
        dependencies=[require("read")],
    )
    def nearest_boundary(
        project: str,
        request: Request,
        worker: Annotated[str | None, Query(min_length=1, max_length=512)] = None,
        item: Annotated[str | None, Query(min_length=1, max_length=512)] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 10,
        candidates: Annotated[int, Query(ge=1, le=MAX_PAIRS)] = 200,
    ) -> dict[str, Any]:
        """The (worker, item) pairs nearest the dyadic model's decision boundary (smallest
        h_min first). With ``worker``: among the items in the active-learning queue this worker
        has not labelled (the first ``candidates``). With ``item``: among the project's
        workers who have not labelled it (the ``candidates`` with the most labels)."""
        svc = _service(request)
        record = svc.project(project)
        settings = svc.dyadic(record)
        if (worker is None) == (item is None):
            raise ApiError(422, "invalid_query", "give exactly one of worker and item")
        if worker is not None:
            qs = _queue_settings(svc, project)
            items = [q.item for q in _queue_for(svc, record, qs, candidates, worker)]
            workers = [worker] * len(items)
        else:
            assert item is not None
            items, workers = _boundary_workers(svc, project, item, candidates)
        p = predict_pairs(svc.store, project, settings, workers, items)
        nearest = _nearest_boundary(workers, items, p, limit)
        pairs = _predictions(record, workers, items, p, nearest)
        return {
            "pairs": pairs, "worker": worker, "item": item, "candidates": len(items),
            "position": p.position,
        }  # fmt: skip

    # ------------------------------------------------------------------ dashboard
    @app.get(
        "/v1/projects/{project}/summary",
        operation_id="project_summary",
        tags=["dashboard"],
        response_model=Summary,
        responses=_ERRORS,
        dependencies=[require("read")],
    )
    def project_summary(
        project: str, request: Request, workers: Annotated[int, Query(ge=0, le=1000)] = 25
    ) -> dict[str, Any]:
        """Counts, a 20-bin histogram of each item's top probability, items per most likely
        label, and the ``workers`` least informative workers with their confusion matrices."""
        svc = _service(request)
        record = svc.project(project)
        return _summary(svc, record, workers)

    app.mount("/dashboard", StaticFiles(directory=DASHBOARD, html=True), name="dashboard")

    # ------------------------------------------------------------------ workers
    @app.get(
        "/v1/projects/{project}/workers/{worker:path}",
        operation_id="get_worker",
        tags=["workers"],
        response_model=Worker,
        responses=_ERRORS,
        dependencies=[require("read")],
    )
    def get_worker(project: str, worker: str, request: Request) -> Worker:
        svc = _service(request)
        record = svc.project(project)
        blob = svc.store.get_worker(project, worker)
        if blob is None:
            raise ApiError(
                404, "unknown_worker", f"no labels from worker {worker!r} have been applied yet"
            )
        return _workers_view(svc, record, [(worker, blob)], with_confusion=True)[0]

    @app.get(
        "/v1/projects/{project}/workers",
        operation_id="list_workers",
        tags=["workers"],
        response_model=WorkerPage,
        responses=_ERRORS,
        dependencies=[require("read")],
    )
    def list_workers(
        project: str,
        request: Request,
        order: Literal["best", "worst"] = "best",
        by: Literal["informativeness", "accuracy"] = "informativeness",
        limit: Annotated[int, Query(ge=1, le=10000)] = 100,
        offset: Annotated[int, Query(ge=0)] = 0,
    ) -> WorkerPage:
        """Workers ranked by estimated quality; ``order=worst`` puts likely spammers first."""
        svc = _service(request)
        record = svc.project(project)
        views = _workers_view(svc, record, svc.store.all_workers(project), with_confusion=False)
        views.sort(key=lambda w: (getattr(w, by), w.n_labels, w.worker), reverse=order == "best")
        return WorkerPage(workers=views[offset : offset + limit], total=len(views))

    return app


async def _in_thread(fn: Any, *args: Any) -> Any:
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(fn, *args)
