"""``crowdtally serve`` (the API, by default with the engine in process) and ``crowdtally engine``."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import urlsplit

import typer

from app.cli.common import hold_data_dir, load_settings, open_database, use_store
from app.io.input import InputError

if TYPE_CHECKING:
    from app.settings import Settings


def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8000,
    store: Annotated[
        str | None, typer.Option(help="embedded (default) or redis; else CROWDTALLY_STORE.")
    ] = None,
    data_dir: Annotated[
        Path | None, typer.Option(help="Embedded store folder; else CROWDTALLY_DATA_DIR.")
    ] = None,
    engine: Annotated[
        bool | None,
        typer.Option(
            "--engine/--no-engine",
            help="Run the engine in this process (default: yes; production runs "
            "'crowdtally engine' beside the API and passes --no-engine).",
        ),
    ] = None,
    workers: Annotated[int, typer.Option(min=1, help="API processes (redis store only).")] = 1,
) -> None:
    """Start the HTTP API (and, by default, the engine in the same process)."""
    import gc
    import os
    import subprocess

    use_store(store)  # (a bad flag refused before anything starts)
    gc.disable()  # while loading: the warm-up's freeze_what_is_loaded enables it again

    from app.serving.kernel_cache import looks_cached

    # On a first start the kernels' warm-up (app.serving.warmup) compiles in two processes:
    # the second one starts here, before our imports.
    second = None
    if not looks_cached():
        second = subprocess.Popen(
            [sys.executable, "-m", "app.serving.warmup"], stdout=subprocess.PIPE
        )
    import uvicorn

    from app.serving import warmup

    warmup.adopt(second)

    if data_dir is not None:
        os.environ["CROWDTALLY_DATA_DIR"] = str(data_dir)
    if engine is not None:
        os.environ["CROWDTALLY_ENGINE_IN_PROCESS"] = "true" if engine else "false"
    settings = load_settings()
    from app import logs

    logs.configure(settings.log_format, settings.log_level)
    if workers > 1 and (settings.store != "redis" or settings.engine_in_process):
        raise InputError("--workers", None, "several API processes need --store redis --no-engine")
    if settings.store == "embedded" and not settings.engine_in_process:
        raise InputError("--no-engine", None, "the embedded store's engine runs in the API's "
                         "process: no other process can apply its labels (--store redis)")  # fmt: skip
    check_places(settings)
    check_port(host, port)  # (before anything is made: a folder, a database, an admin key)
    hold_data_dir(settings)  # (embedded: no second process on the folder)
    open_database(settings, who="crowdtally")  # (reachable and migrated before the server
    # starts, or waited for; ~1 ms again there)
    if settings.store == "redis" and settings.engine_in_process:  # (no second engine: its
        claim_sole_engine(settings)  # refusal one line here, not a failed startup's traceback)
    print(start_line(settings, host, port, first_start=second is not None), file=sys.stderr)
    if weak := weak_admin_key(settings):
        print(weak, file=sys.stderr)
    if workers > 1:  # (the processes serving are started anew: this one only watches them)
        gc.enable()
        shared_metrics()
    uvicorn.run(
        "app.api:create_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_config=None,  # uvicorn's loggers go through ours (JSON by default)
        log_level="warning",
        access_log=False,
    )


def start_line(settings: Settings, host: str, port: int, *, first_start: bool) -> str:
    """What ``serve`` prints before the server starts: the store, where the engine runs, the
    address; on a first start, that requests wait for the kernels' compilation."""
    engine = "in process" if settings.engine_in_process else "separate"
    line = f"crowdtally: {settings.store} store, engine {engine}, http://{host}:{port}/docs"
    if first_start:
        line += (
            "\ncrowdtally: first start on this machine: the kernels compile before the server "
            "accepts connections (about 15-30 s, once)"
        )
    return line


SHORTEST_ADMIN_KEY = 16
"""Characters below which ``serve`` warns of a guessable CROWDTALLY_ADMIN_KEY (a key it makes
has 46)."""


def weak_admin_key(settings: Settings) -> str | None:
    """A warning line when the configured admin key is short enough to be guessed, else None."""
    key = settings.admin_key
    if key is None or len(key) >= SHORTEST_ADMIN_KEY:
        return None
    return (
        f"crowdtally: warning: CROWDTALLY_ADMIN_KEY has {len(key)} character"
        f"{'' if len(key) == 1 else 's'}; a key shorter than "
        f"{SHORTEST_ADMIN_KEY} can be guessed (the one made on a first start without it has 46)"
    )


def claim_sole_engine(settings: Settings) -> None:
    """The lease of the one engine outside a pool, taken by this process (the server it runs
    renews it: the same holder) or an InputError naming the engine that holds it."""
    from app.engine.runtime import SoleEngine, sole_engine_id
    from app.store import open_store

    store = open_store(settings)
    try:
        SoleEngine(store, sole_engine_id(), settings.engine_lease_s).claim("crowdtally serve")
    finally:
        store.close()


def shared_metrics() -> None:
    """A folder of this run where the API processes keep their counters and histograms, so
    that ``/metrics`` from any of them gives the sum (prometheus_client's multiprocess mode;
    removed at exit)."""
    import atexit
    import os
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="crowdtally-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder
    atexit.register(shutil.rmtree, folder, ignore_errors=True)


def check_port(host: str, port: int) -> None:
    """The address can be listened on now (else one line, before the service makes its data
    folder, database and admin key; the server binds it again, as uvicorn does)."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise InputError("--host", None, f"{host!r}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (as uvicorn binds)
        try:
            probe.bind(address)
        except OSError as exc:
            raise InputError(
                "--port", None, f"cannot listen on {host}:{port}: {exc.strerror}"
            ) from None


def engine_command(
    store: Annotated[
        str | None, typer.Option(help="redis or embedded; else CROWDTALLY_STORE, else redis.")
    ] = None,
    pool: Annotated[
        bool | None,
        typer.Option(
            "--pool/--no-pool",
            help="Join a pool of engines sharing the projects, one engine per project at a "
            "time (default: no; else CROWDTALLY_ENGINE_POOL).",
        ),
    ] = None,
) -> None:
    """Run the engine on its own: apply every project's label log and write served state."""
    import gc
    import os
    import signal

    use_store(store, default="redis")  # (a bad flag refused before anything starts)
    gc.disable()  # while loading: freeze_what_is_loaded enables it again

    from app.engine.runtime import (
        SoleEngine,
        make_engine_loop,
        refuse_beside_sole_engine,
        sole_engine_id,
    )
    from app.store import open_store_when_reachable
    from app.store.archive import rebuild_store

    if pool is not None:
        os.environ["CROWDTALLY_ENGINE_POOL"] = "true" if pool else "false"
    settings = load_settings()
    from app import logs

    logs.configure(settings.log_format, settings.log_level)
    check_places(settings)
    hold_data_dir(settings)
    db = open_database(settings, who="crowdtally engine")  # (the store's projects rebuilt
    # from it if Redis lost them)
    st, _ = open_store_when_reachable(
        settings, lambda st: rebuild_store(st, db), "crowdtally engine"
    )
    from app.serving.warmup import dyadic_ready, freeze_what_is_loaded, warm_up

    sole = None
    if settings.engine_pool:
        refuse_beside_sole_engine(st, settings.engine_lease_s)
    elif not st.log_in_sql:  # (a shared store: one engine outside a pool)
        sole = SoleEngine(st, sole_engine_id(), settings.engine_lease_s)
        sole.claim()
    warm_up()  # the kernels, compiled in two processes on a first start
    loop = make_engine_loop(settings, st, db, dyadic_ready)
    freeze_what_is_loaded()
    where = f" (pool engine {loop.pool.engine_id})" if loop.pool is not None else ""
    print(f"crowdtally engine: {settings.store} store{where}", file=sys.stderr)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stopped: leases given up
    if sole is not None:
        sole.keep(loop.halt)
    with contextlib.suppress(KeyboardInterrupt):
        try:
            loop.run_forever()
        finally:
            loop.release_leases()
            if sole is not None and loop.halted is None:
                sole.release()
    if loop.halted is not None:
        raise InputError("crowdtally engine", None, loop.halted)


def check_places(settings: Settings) -> None:
    """The data folder and the database URL, checked before anything starts: each mistake
    is one error line (they were tracebacks)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    if settings.data_dir.exists() and not settings.data_dir.is_dir():
        raise InputError("CROWDTALLY_DATA_DIR", None, f"{settings.data_dir} is not a folder")
    if settings.database_url is not None:
        try:
            make_url(settings.database_url)
        except ArgumentError as err:
            raise InputError("CROWDTALLY_DATABASE_URL", None, str(err)) from None
    if settings.store == "redis":
        check_redis(settings.redis_url, settings.redis_cluster)


def refuse_eviction(node: str, memory: Mapping[str, object]) -> None:
    """A Redis that evicts any key once it reaches its maxmemory (an ``allkeys-*`` policy)
    would drop label logs and label ids, acknowledged labels lost, without a word: one error
    line. ``noeviction`` refuses writes instead (the API answers 507 store_full); the
    ``volatile-*`` policies evict only keys that expire, of which crowdtally has only the
    engines' leases (fenced: a lease lost early costs a takeover, never a write)."""
    policy = str(memory.get("maxmemory_policy", "noeviction"))
    limit = int(str(memory.get("maxmemory", 0)) or 0)
    if limit and policy.startswith("allkeys"):
        raise InputError("REDIS_URL", None, f"{node} evicts keys at its maxmemory ({limit} bytes, "
                         f"maxmemory-policy {policy}): acknowledged labels would be lost; set "
                         "maxmemory-policy noeviction (CONFIG SET maxmemory-policy noeviction)")  # fmt: skip


def cluster_nodes(client: Any, url: str) -> dict[str, str]:
    """The other nodes of the cluster ``client`` (at ``url``) is a node of, by address, each
    with the URL that reaches it as ``url`` reaches this one (its user, password, scheme and
    database); none if the cluster keeps its list to itself."""
    from redis.exceptions import RedisError

    try:
        nodes = client.execute_command("CLUSTER NODES")
    except RedisError:
        return {}
    parts = urlsplit(url)
    user = parts.netloc.rpartition("@")[0]
    return {
        address: parts._replace(netloc=f"{user}@{address}" if user else address).geturl()
        for address, node in nodes.items()
        if "myself" not in node["flags"]
    }


def node_memory(url: str) -> Mapping[str, object]:
    """``INFO memory`` of the Redis at ``url``; empty if it does not answer (it is then the
    client's to find, as a down Redis is)."""
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
    with contextlib.closing(client):
        try:
            memory: Mapping[str, object] = client.info("memory")
        except redis.exceptions.RedisError:
            return {}
    return memory


def check_redis(url: str, cluster: bool = False) -> None:
    """A Redis that answers but refuses the URL (a database index it lacks, a wrong password),
    or whose cluster mode is not the one ``cluster`` (CROWDTALLY_REDIS_CLUSTER) says, is one
    error line (a plain Redis named as a cluster's node was retried every second for ever); one
    that cannot be reached is waited for, as before. With ``cluster``, the URL's first node,
    and for eviction every node the cluster lists (``cluster_nodes``): a replica is a primary
    after a failover."""
    import redis
    from redis.exceptions import ConnectionError, ResponseError, TimeoutError

    node = url.split(",")[0].strip() if cluster else url
    try:
        client = redis.Redis.from_url(node, socket_connect_timeout=2, socket_timeout=2)
    except ValueError as err:
        raise InputError("REDIS_URL", None, str(err)) from None
    with contextlib.closing(client):
        try:
            client.ping()
        except (ConnectionError, TimeoutError):
            return  # (down: the store is waited for)
        except ResponseError as err:
            raise InputError("REDIS_URL", None, f"{node}: {err}") from None
        try:
            in_cluster = bool(client.info("cluster").get("cluster_enabled"))
            memory = client.info("memory")
        except (ConnectionError, TimeoutError, ResponseError):
            return  # (a Redis that keeps INFO to itself: its mode is left for the client to find)
        others = cluster_nodes(client, node) if cluster and in_cluster else {}
    refuse_eviction(node, memory)
    for address, other in others.items():
        refuse_eviction(address, node_memory(other))
    if cluster and not in_cluster:
        raise InputError("CROWDTALLY_REDIS_CLUSTER", None, f"true, but {node} is a single Redis "
                         "(not in cluster mode): leave it unset for one Redis")  # fmt: skip
    if in_cluster and not cluster:
        raise InputError("CROWDTALLY_REDIS_CLUSTER", None, f"not set, but {node} is a node of a "
                         "Redis Cluster: set CROWDTALLY_REDIS_CLUSTER=true")  # fmt: skip
