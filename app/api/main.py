"""The app factory: settings, store and engine in a lifespan, then one router per domain."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from importlib.resources import files
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from app.api import metrics
from app.api.auth import ensure_admin_key
from app.api.bodies import add_body_schemas
from app.api.codings import CompressAnswers
from app.api.deps import Service
from app.api.errors import add_handlers
from app.api.middleware import HeadAsGet, LimitBody, ObserveRequests, PlainPath, TimedStore
from app.api.routes import (
    calibration,
    dashboard,
    items,
    labels,
    operations,
    predictions,
    projects,
    queue,
    snapshots,
    workers,
)
from app.api.store_watch import StoreWatch
from app.engine.runtime import SoleEngine, make_engine_loop, sole_engine_id
from app.serving.warmup import dyadic_ready, freeze_what_is_loaded
from app.serving.warmup import warm_up as warm_up_kernels
from app.settings import Settings
from app.store import open_store_when_reachable
from app.store.archive import SnapshotDB, open_snapshot_db, rebuild_store
from app.store.base import Store

Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]


def _admin_key(st: Store, db: SnapshotDB, settings: Settings) -> None:
    """The store's admin key (the configured one, or one made and printed once), archived in
    SQL at once: a Redis wiped before any snapshot gives it back."""
    key_file = settings.data_dir / "admin.key" if settings.store == "embedded" else None
    made = ensure_admin_key(st, settings.admin_key, key_file)
    if made:
        where = f" (saved in {key_file})" if key_file else ""
        print(f"crowdtally: created the admin API key{where}: {made}", file=sys.stderr, flush=True)
    db.put_keys(st.list_keys(None))


def lifespan(settings: Settings, store: Store | None) -> Lifespan:
    """Open the store (unless given; waiting while Redis cannot be reached) and the snapshot
    database, rebuild a wiped store (at start, and on Redis whenever it is wiped while the API
    runs: ``StoreWatch``), start the engine in process (if so set); close them on shutdown."""

    @asynccontextmanager
    async def run(app: FastAPI) -> AsyncIterator[None]:
        db = open_snapshot_db(settings)

        def first_use(st: Store) -> list[str]:
            rebuilt = rebuild_store(st, db)  # (first: a wiped Redis gets its admin key back,
            _admin_key(st, db, settings)  # and no new one besides it)
            return rebuilt

        if store is None:
            st, rebuilt = open_store_when_reachable(settings, first_use, "crowdtally")
        else:
            st, rebuilt = store, first_use(store)
        if rebuilt:
            print(f"crowdtally: rebuilt {rebuilt} from the SQL snapshots", file=sys.stderr)
        watch = None
        if not st.log_in_sql:  # a Redis that restarts empty is rebuilt without a restart
            watch = StoreWatch(st, db, lambda s: _admin_key(s, db, settings))
            watch.start()
        took = warm_up_kernels()  # before the engine's first step and the first request
        if took > 5:
            print(
                f"crowdtally: compiled the kernels in {took:.0f} s (once); serving", file=sys.stderr
            )
        engine, sole = None, None
        if settings.engine_in_process:
            if not st.log_in_sql:  # a shared store: the one engine outside a pool
                sole = SoleEngine(st, sole_engine_id(), settings.engine_lease_s)
                sole.claim("crowdtally serve")
            engine = make_engine_loop(settings, st, db, dyadic_ready)
            if sole is not None:
                sole.keep(engine.halt)
            engine.start()
        app.state.service = Service(settings, cast(Store, TimedStore(st)), engine, db, watch)
        freeze_what_is_loaded()
        metrics.bind(app.state.service)
        try:
            yield
        finally:
            if watch is not None:
                watch.stop()
            if engine is not None:
                engine.stop()
                if sole is not None and engine.halted is None:
                    sole.release()
                if engine.snapshotter is not None:
                    engine.snapshotter.close()
            if store is None:
                st.close()

    return run


DOCS_ASSETS = "/docs/assets"
"""Swagger UI's and ReDoc's JavaScript and CSS, served from the installed ``fastapi-offline``
package (no CDN: the docs work without internet)."""


def mount_docs(app: FastAPI) -> None:
    """/docs (Swagger UI) and /redoc, their assets served by this process (FastAPI's
    "self-hosting JavaScript and CSS for docs")."""
    assets = files("fastapi_offline") / "static"
    app.mount(DOCS_ASSETS, StaticFiles(directory=str(assets)), name="docs-assets")
    openapi_url = app.openapi_url or "/openapi.json"
    oauth2_url = app.swagger_ui_oauth2_redirect_url or "/docs/oauth2-redirect"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=root + openapi_url,
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=root + oauth2_url,
            swagger_js_url=f"{root}{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{root}{DOCS_ASSETS}/favicon.png",
            swagger_ui_parameters={"validatorUrl": None},  # no badge from validator.swagger.io
        )

    @app.get(oauth2_url, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=root + openapi_url,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{DOCS_ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{DOCS_ASSETS}/favicon.png",
            with_google_fonts=False,
        )


def document_bodies(app: FastAPI) -> None:
    """The OpenAPI document with the schemas of the bodies read by hand (every ``$ref`` in it
    resolves)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        document = generate()  # made once, then FastAPI's cached copy
        add_body_schemas(document)
        return document

    app.openapi = openapi  # type: ignore[method-assign]


def create_app(settings: Settings | None = None, store: Store | None = None) -> FastAPI:
    settings = settings or Settings()
    app = FastAPI(
        title="crowdtally",
        version="0.1.0",
        summary="Live label aggregation for crowdsourcing: posteriors, worker quality, queues.",
        lifespan=lifespan(settings, store),
        docs_url=None,  # mount_docs: served without a CDN
        redoc_url=None,
    )
    mount_docs(app)
    document_bodies(app)
    add_handlers(app)
    app.add_middleware(CompressAnswers)
    app.add_middleware(HeadAsGet)
    app.add_middleware(LimitBody, limit=settings.max_body_bytes)
    app.add_middleware(PlainPath)
    app.add_middleware(ObserveRequests)  # outermost: it sees (and times) every answer
    for domain in (operations, projects, labels, snapshots, items, queue, predictions):
        app.include_router(domain.router)
    app.include_router(dashboard.router)
    dashboard.mount_page(app)
    app.include_router(workers.router)
    app.include_router(calibration.router)
    return app
