"""docker-compose.yml and the Dockerfile, checked without Docker.

The compose file is parsed with PyYAML; the api and engine commands are checked against the
installed ``crowdtally`` command line itself (its ``--help``, and a parse of the exact argument
list), so a renamed flag fails here rather than in a container restart loop.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from click.testing import Result
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from typer.testing import CliRunner

from app.cli import app as cli
from app.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
API_COMMAND = ["crowdtally", "serve", "--host", "0.0.0.0", "--port", "8000", "--no-engine"]
ENGINE_COMMAND = ["crowdtally", "engine"]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    svc: dict[str, Any] = compose["services"]
    return svc


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("crowdtally")
    prefix = [exe] if exe else [sys.executable, "-c", "from app.cli import main; main()"]
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
    return subprocess.run(
        [*prefix, *args], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT
    )


def _help(*args: str) -> Result:
    """The command line's answer to ``args`` (ending in --help), in this process: the same
    parsing as the ``crowdtally`` executable, without a process start per case."""
    env = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
    return CliRunner().invoke(cli, list(args), env=env)


def _flags(help_text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", help_text))


def _options(args: list[str]) -> list[str]:
    return [a for a in args if a.startswith("--")]


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service["environment"]
    if isinstance(env, list):  # KEY=value form
        env = dict(x.split("=", 1) for x in env)
    return {k: str(v) for k, v in env.items()}


def _health_test(service: dict[str, Any]) -> list[str]:
    test = service["healthcheck"]["test"]
    return [test] if isinstance(test, str) else list(test)


def _healthy(service: dict[str, Any], needed: str) -> bool:
    dep = service["depends_on"]
    return isinstance(dep, dict) and dep.get(needed, {}).get("condition") == "service_healthy"


def _healthy_redis(service: dict[str, Any]) -> bool:
    return _healthy(service, "redis") and _healthy(service, "postgres")


def _named_volume_at(compose: dict[str, Any], service: dict[str, Any], target: str) -> str:
    for v in service["volumes"]:
        source, _, path = (v if isinstance(v, str) else f"{v['source']}:{v['target']}").partition(
            ":"
        )
        if path.split(":")[0] == target:
            assert source in (compose.get("volumes") or {}), f"volume {source!r} not declared"
            return source
    raise AssertionError(f"no volume mounted at {target}")


CLUSTER_NODES = [f"redis-node-{n}" for n in range(1, 7)]
API_CLUSTER_COMMAND = [*API_COMMAND, "--workers", "2"]
ENGINE_POOL_COMMAND = ["crowdtally", "engine", "--pool"]


def test_the_four_services_and_the_cluster_profile(services: dict[str, Any]) -> None:
    default = {n for n, svc in services.items() if not svc.get("profiles")}
    assert default == {"redis", "postgres", "api", "engine"}
    cluster = {n for n, svc in services.items() if svc.get("profiles") == ["cluster"]}
    assert cluster == {*CLUSTER_NODES, "redis-cluster-init", "api-cluster", "engine-pool"}


def test_the_cluster_profile_s_redis_nodes(
    compose: dict[str, Any], services: dict[str, Any]
) -> None:
    """Six nodes with cluster mode and an append-only file each, made one cluster with a
    replica per primary by the init service, which the API and engines wait for."""
    for name in CLUSTER_NODES:
        node = services[name]
        assert node["image"] == "redis:7"
        cmd = node["command"]
        pairs = dict(zip(cmd[1::2], cmd[2::2], strict=True))
        assert pairs["--cluster-enabled"] == "yes" and pairs["--appendonly"] == "yes"
        assert pairs["--cluster-announce-hostname"] == name
        assert _named_volume_at(compose, node, "/data")
    create = services["redis-cluster-init"]["command"][0]
    assert "--cluster create" in create and "--cluster-replicas 1" in create
    assert all(f"{name}:6379" in create for name in CLUSTER_NODES)
    for name in ("api-cluster", "engine-pool"):
        dep = services[name]["depends_on"]["redis-cluster-init"]
        assert dep["condition"] == "service_completed_successfully"


def test_the_cluster_profile_s_api_and_engine_pool(
    services: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    api, pool = services["api-cluster"], services["engine-pool"]
    assert api["command"] == API_CLUSTER_COMMAND and api["ports"] == ["8001:8000"]
    assert pool["command"] == ENGINE_POOL_COMMAND and pool["deploy"]["replicas"] == 3
    assert api["image"] == pool["image"] == services["api"]["image"]
    for key in list(os.environ):
        if key.startswith("CROWDTALLY_") or key == "REDIS_URL":
            monkeypatch.delenv(key)
    for key, value in _env(pool).items():
        monkeypatch.setenv(key, "k" if key == "CROWDTALLY_ADMIN_KEY" else value)
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert settings.redis_cluster
    nodes = [urlsplit(url).hostname for url in settings.redis_url.split(",")]
    assert len(nodes) >= 2 and all(n in services and "redis-node" in n for n in nodes), nodes
    assert settings.redis_wait_replicas == 1


def test_redis_keeps_an_append_only_file(compose: dict[str, Any], services: dict[str, Any]) -> None:
    redis = services["redis"]
    assert redis["image"] == "redis:7"
    cmd = redis["command"]
    assert isinstance(cmd, list) and cmd[0] == "redis-server"
    pairs = dict(zip(cmd[1::2], cmd[2::2], strict=True))
    assert pairs["--appendonly"] == "yes"
    assert pairs["--appendfsync"] == "everysec"
    assert _health_test(redis)[1:] == ["redis-cli", "ping"]
    assert _named_volume_at(compose, redis, "/data")


def test_postgres(compose: dict[str, Any], services: dict[str, Any]) -> None:
    pg = services["postgres"]
    assert pg["image"] == "postgres:16"
    env = _env(pg)
    assert env["POSTGRES_DB"] == "crowdtally"
    assert "POSTGRES_PASSWORD" in env or env.get("POSTGRES_HOST_AUTH_METHOD") == "trust"
    assert any("pg_isready" in part for part in _health_test(pg))
    assert _named_volume_at(compose, pg, "/var/lib/postgresql/data")
    assert "ports" not in pg, "the database stays on the compose network"


def test_api_service(services: dict[str, Any]) -> None:
    api = services["api"]
    assert api["build"]["context"] == "."
    assert (ROOT / api["build"].get("dockerfile", "Dockerfile")).is_file()
    assert api["command"] == API_COMMAND
    assert api["ports"] == ["8000:8000"]
    assert _healthy_redis(api)
    test = _health_test(api)
    assert test[0] == "CMD"
    assert "http://127.0.0.1:8000/healthz" in test[-1]
    compile(test[-1], "api healthcheck", "exec")  # the python -c one-liner is valid Python


def test_engine_service(services: dict[str, Any]) -> None:
    api, engine = services["api"], services["engine"]
    assert engine["image"] == api["image"]
    assert engine["build"] == api["build"]
    assert engine["command"] == ENGINE_COMMAND
    assert "ports" not in engine
    assert _healthy_redis(engine)
    test = _health_test(engine)
    assert test[:3] == ["CMD", "python", "-c"]
    assert "ping()" in test[3] and "REDIS_URL" in test[3]
    compile(test[3], "engine healthcheck", "exec")


@pytest.mark.parametrize("name", ["api", "engine"])
def test_service_environment(
    services: dict[str, Any], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = _env(services[name])
    assert env["CROWDTALLY_STORE"] == "redis"
    assert env["REDIS_URL"] == "redis://redis:6379/0"
    db = env["CROWDTALLY_DATABASE_URL"]
    assert db.startswith("postgresql+psycopg://crowdtally:") and db.endswith(
        "@postgres:5432/crowdtally"
    )
    assert re.fullmatch(r"\$\{CROWDTALLY_ADMIN_KEY(:?[?-][^}]*)?\}", env["CROWDTALLY_ADMIN_KEY"])
    # The names are the ones the service reads.
    for key in list(os.environ):
        if key.startswith("CROWDTALLY_") or key == "REDIS_URL":
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, "k" if key == "CROWDTALLY_ADMIN_KEY" else value)
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert (settings.store, settings.redis_url, settings.admin_key) == (
        "redis",
        "redis://redis:6379/0",
        "k",
    )
    assert settings.database_url_resolved() == env["CROWDTALLY_DATABASE_URL"]


@pytest.mark.parametrize(
    ("name", "expected"),
    [("api", API_COMMAND), ("engine", ENGINE_COMMAND), ("api-cluster", API_CLUSTER_COMMAND),
     ("engine-pool", ENGINE_POOL_COMMAND)],
    ids=["api", "engine", "api-cluster", "engine-pool"],
)  # fmt: skip
def test_commands_are_what_the_cli_accepts(
    services: dict[str, Any], name: str, expected: list[str]
) -> None:
    command = services[name]["command"]
    assert command[0] == "crowdtally"
    shown = _help(command[1], "--help")
    assert shown.exit_code == 0, shown.output
    assert set(_options(command[2:])) <= _flags(shown.output), shown.output
    # The exact argument list parses: an unknown option or a missing value fails before
    # --help (eager) exits.
    parsed = _help(*command[1:], "--help")
    assert parsed.exit_code == 0, parsed.output
    assert command == expected


def test_api_port_is_the_published_one(services: dict[str, Any]) -> None:
    api = services["api"]
    port = api["command"][api["command"].index("--port") + 1]
    host = api["command"][api["command"].index("--host") + 1]
    assert host == "0.0.0.0"
    assert all(p.split(":")[-1] == port for p in api["ports"])
    assert f":{port}/healthz" in _health_test(api)[-1]


def test_dockerfile() -> None:
    text = (ROOT / "Dockerfile").read_text()
    lines = [x.strip() for x in text.splitlines() if x.strip() and not x.lstrip().startswith("#")]
    assert lines[0] == "FROM python:3.11-slim"
    assert re.search(r"^RUN pip install (--no-deps )?(-e )?\.(\s|$)", text, re.M), (
        "installs the package"
    )
    for what in ("core", "app", "migrations", "alembic.ini"):  # store/sql.py: REPO/"alembic.ini"
        assert re.search(rf"^COPY {re.escape(what)} ", text, re.M), what
    assert re.search(r"^USER (?!root)", text, re.M), "the processes do not run as root"
    cmd = re.search(r"^CMD (\[.*\])$", text, re.M)
    assert cmd is not None
    assert yaml.safe_load(cmd.group(1)) == API_COMMAND
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".git" in ignored and ".env" in ignored


@pytest.mark.slow
def test_dockerfile_warm_up_runs(tmp_path: Path) -> None:
    """The image compiles the numba kernels at build time (the service's whole warm-up, and
    CLI runs on a small answer file); its lines must keep working as the code changes: run
    them here."""
    text = (ROOT / "Dockerfile").read_text()
    answers = re.search(r"printf '([^']*)' > /tmp/warm.csv", text)
    assert answers is not None
    warm = tmp_path / "warm.csv"
    warm.write_text(answers.group(1).replace("\\n", "\n"))
    runs = re.findall(r"crowdtally extract /tmp/warm.csv([^>&\\]*)", text)
    assert sorted(r.strip() for r in runs) == ["", "--batch"]
    for extra in runs:
        done = _cli("extract", str(warm), *extra.split())
        assert done.returncode == 0, done.stderr
    snippets = re.findall(r'python -c "([^"]*)"', text.split("\nUSER ", 1)[1])
    # every kernel the service calls (tests/app/test_warmup.py: everything() reaches them
    # all), not only extract's: else each container's first start compiles the rest
    assert "from app.serving import warmup; warmup.everything()" in snippets
    for snippet in snippets:
        done = subprocess.run(
            [sys.executable, "-c", snippet], capture_output=True, text=True, timeout=300, cwd=ROOT
        )
        assert done.returncode == 0, done.stderr


def _closure(requirements: list[str]) -> set[str]:
    """Distributions that installing ``requirements`` brings (extras followed, as installed)."""
    seen: set[tuple[str, frozenset[str]]] = set()
    stack = [Requirement(r) for r in requirements]
    while stack:
        req = stack.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            needs = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in needs:
            sub = Requirement(text)
            extras = req.extras or {""}
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in extras):
                stack.append(sub)
    return {name for name, _ in seen}


def test_the_image_gets_every_imported_library() -> None:
    """The image installs pyproject.toml's dependencies only: every library that app/ and core/
    import, and the PostgreSQL driver of the compose URL, must come with them."""
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    have = _closure(declared)
    modules = {"psycopg"}  # postgresql+psycopg:// in docker-compose.yml
    for path in [*(ROOT / "app").rglob("*.py"), *(ROOT / "core").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                modules.add(node.module.split(".")[0])
    owners = metadata.packages_distributions()
    missing = sorted(
        m
        for m in modules
        if m not in sys.stdlib_module_names
        and m not in ("app", "core")
        and not {canonicalize_name(d) for d in owners.get(m, [m])} & have
    )
    assert not missing, f"imported but not in pyproject.toml's dependencies: {missing}"
