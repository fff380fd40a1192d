"""Projects and their keys (admin: create, list, revoke; the admin key's rotation), a
project's settings and stats (read)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response
from sqlalchemy.exc import SQLAlchemyError

from app.api.auth import issue_key, key_hash, revoke_key, rotate_admin_key
from app.api.deps import ServiceDep, require
from app.api.errors import ERRORS, WRITES, ApiError
from app.api.key_schemas import AdminKeyRotated, KeyInfo
from app.api.schemas import (
    DyadicSettingsBody,
    KeyCreate,
    KeyCreated,
    Project,
    ProjectCreate,
    ProjectCreated,
)
from app.api.views import project_view
from app.engine.dyadic import settings_for
from app.engine.project import model_bytes, nominal_slot_bytes
from app.serving.nominal import iso
from app.store.base import ProjectExistsError, ProjectRecord
from core.nominal import MAX_FIRST_STEP, NominalConfig

router = APIRouter()


def dyadic_settings(body: DyadicSettingsBody, n_classes: int) -> dict[str, Any] | None:
    """The project's dyadic settings to store (None: no dyadic model), or 422 for settings
    that would be dropped or mean nothing (they were accepted and silently ignored)."""
    given = sorted(body.model_fields_set - {"enabled"})
    if not body.enabled:
        if given:
            raise ApiError(422, "invalid_dyadic", f"{', '.join(given)} given with enabled "
                           "false: a project without the dyadic model keeps no settings for it",
                           None, "dyadic")  # fmt: skip
        return None
    if "reduction" in given and (body.ordinal or n_classes == 2):
        raise ApiError(422, "invalid_dyadic", "reduction is for nominal labels of 3 or more "
                       "classes: " + ("ordinal labels have one scorer" if body.ordinal else
                       "two classes have one scorer"), None, "dyadic")  # fmt: skip
    fields = body.model_dump(exclude={"enabled"})
    try:
        settings = settings_for(n_classes, **fields)
    except ValueError as exc:
        raise ApiError(422, "invalid_dyadic", str(exc), None, "dyadic") from None
    rate = settings.config.eta * settings.config.dyadic_rate
    if rate > MAX_FACTOR_RATE:
        raise ApiError(
            422,
            "invalid_dyadic",
            f"eta x dyadic_rate is {rate:g}, the factors' rate: at most {MAX_FACTOR_RATE:g}",
            None,
            "dyadic",
        )
    return settings.to_dict()


MAX_FACTOR_RATE = 100.0
"""The most the dyadic factors' rate eta x dyadic_rate may be (0.3 by default, 0.5 for ordinal
labels): at 100 x 100 the factors overflowed (scores null, an h_min search of 15 s a pair)."""


def check_memory(record: ProjectRecord, limit_mb: int) -> None:
    """422 when the project's models could need more than the per-project limit."""
    need, limit = model_bytes(record), limit_mb * 2**20
    if need <= limit:
        return
    K, slots = len(record.labels), int(record.config["n_worker_slots"])
    dyadic = need - model_bytes(
        ProjectRecord(record.name, record.labels, {**record.config, "dyadic": None}, 0.0)
    )
    per_slot = nominal_slot_bytes(K)
    fit = (limit - (need - slots * per_slot)) // per_slot  # what is not per slot stays
    plus = f", plus {dyadic / 2**20:,.0f} MiB for the dyadic model" if dyadic else ""
    if fit >= 1:
        field, advice = "worker_slots", f"ask for fewer worker_slots (at most {fit:,} fit)"
        if dyadic:
            advice += ", fewer dyadic slots or no dyadic model"
    else:
        field, advice = "dyadic", "ask for fewer dyadic slots or no dyadic model"
    raise ApiError(
        422,
        "project_too_large",
        f"this project could need {need / 2**20:,.0f} MiB ({slots:,} worker slots x {K}^2 x "
        f"{per_slot // (K * K)} bytes{plus}), over the per-project limit of {limit_mb:,} MiB "
        f"(CROWDTALLY_PROJECT_MEMORY_LIMIT_MB): {advice}",
        None,
        field,
    )


@router.post(
    "/v1/projects",
    status_code=201,
    operation_id="create_project",
    tags=["projects"],
    response_model=ProjectCreated,
    responses=WRITES,
    dependencies=[require("admin", per_project=False)],
)
def create_project(body: ProjectCreate, svc: ServiceDep) -> dict[str, Any]:
    hyper = body.hyperparameters.model_dump()
    if hyper["class_prior"] is not None:
        hyper["class_prior"] = tuple(hyper["class_prior"])
    try:
        cfg = NominalConfig(n_classes=len(body.labels), n_worker_slots=body.worker_slots, **hyper)
    except ValueError as exc:
        raise ApiError(422, "invalid_hyperparameters", str(exc), None, "hyperparameters") from None
    if not (first := cfg.first_step()) <= MAX_FIRST_STEP:
        raise ApiError(
            422,
            "invalid_hyperparameters",
            f"eta0 x tau0^-rho x max(1, population_rate x K/2, class_rate) is {first:g}: "
            f"at most {MAX_FIRST_STEP:g} (the first step; past it the parameters overflowed)",
            None,
            "hyperparameters",
        )
    config: dict[str, Any] = cfg.to_dict()
    config["dyadic"] = dyadic_settings(body.dyadic, len(body.labels))
    record = ProjectRecord(body.name, tuple(body.labels), config, time.time())
    check_memory(record, svc.settings.project_memory_limit_mb)
    try:
        svc.store.create_project(record)
    except ProjectExistsError:
        raise ApiError(409, "project_exists", f"a project named {body.name!r} exists") from None
    svc.forget()  # a cached "no such project" must not outlive its creation
    key, key_record = issue_key(svc.store, "write", body.name)
    if not svc.store.log_in_sql:  # archived now: a Redis wiped before its first snapshot
        try:  # gives it back, with its key (and nothing of an earlier project of its name
            svc.db.forget_project(body.name)  # whose deletion SQL missed)
            svc.db.save_project(record)
            svc.db.put_keys({key_hash(key): key_record})
        except SQLAlchemyError:  # (503 snapshot_db_unavailable) nothing kept: it may be sent
            svc.store.delete_project(body.name)  # again; a project only Redis held would be
            svc.forget()  # lost with a wiped Redis, its key with it
            raise
    return {**project_view(svc, record), "api_key": key}


@router.get(
    "/v1/projects",
    operation_id="list_projects",
    tags=["projects"],
    response_model=list[Project],
    responses=ERRORS,
    dependencies=[require("admin", per_project=False)],
)
def list_projects(svc: ServiceDep) -> list[dict[str, Any]]:
    records = svc.store.list_projects()
    progress = svc.store.progress([r.name for r in records])  # (one round trip for all)
    return [project_view(svc, r, progress.get(r.name)) for r in records]


@router.get(
    "/v1/projects/{project}",
    operation_id="get_project",
    tags=["projects"],
    response_model=Project,
    responses=ERRORS,
    dependencies=[require("read")],
)
def get_project(project: str, svc: ServiceDep) -> dict[str, Any]:
    return project_view(svc, svc.project(project))


@router.delete(
    "/v1/projects/{project}",
    status_code=204,
    operation_id="delete_project",
    tags=["projects"],
    responses=WRITES,
    dependencies=[require("admin")],
)
def delete_project(project: str, svc: ServiceDep) -> Response:
    found = svc.store.delete_project(project)
    # Its snapshots and archive go too; after a 404 as well, which is what a deletion sent
    # again after the snapshot database failed gets: a Redis wiped later and rebuilt from SQL
    # would bring the project back.
    svc.db.forget_project(project)
    if not found:
        raise ApiError(404, "unknown_project", f"no project named {project!r}")
    svc.forget()
    return Response(status_code=204)


@router.post(
    "/v1/projects/{project}/keys",
    status_code=201,
    operation_id="create_key",
    tags=["projects"],
    response_model=KeyCreated,
    responses=WRITES,
    dependencies=[require("admin")],
)
def create_key(project: str, body: KeyCreate, svc: ServiceDep) -> KeyCreated:
    svc.project(project)
    key, rec = issue_key(svc.store, body.scope, project)
    try:
        svc.db.put_keys({key_hash(key): rec})  # (archived now: a wiped Redis gives it back)
    except SQLAlchemyError:  # (503 snapshot_db_unavailable) a key no one was given
        svc.store.delete_key(key_hash(key))
        raise
    return KeyCreated(api_key=key, key_id=rec.key_id, scope=rec.scope, project=project)


@router.get(
    "/v1/projects/{project}/keys",
    operation_id="list_keys",
    tags=["projects"],
    response_model=list[KeyInfo],
    responses=ERRORS,
    dependencies=[require("admin")],
)
def list_keys(project: str, svc: ServiceDep) -> list[KeyInfo]:
    """The project's keys: ids, scopes and when they were issued (never the keys)."""
    svc.project(project)
    keys = sorted(
        svc.store.list_keys(project).values(), key=lambda k: (k.created_at or 0, k.key_id)
    )
    return [
        KeyInfo(
            key_id=k.key_id,
            scope=k.scope,
            project=k.project,
            created_at=iso(k.created_at) if k.created_at is not None else None,
        )
        for k in keys
    ]


@router.delete(
    "/v1/projects/{project}/keys/{key_id}",
    status_code=204,
    operation_id="revoke_key",
    tags=["projects"],
    responses=WRITES,
    dependencies=[require("admin")],
)
def revoke_project_key(project: str, key_id: str, svc: ServiceDep) -> Response:
    """Revoke a key of the project. Every API process stops accepting it within a second
    (each caches key records for that long); this one at once."""
    svc.project(project)
    h = revoke_key(svc.store, project, key_id)
    if h is None:
        raise ApiError(404, "unknown_key", f"project {project!r} has no key {key_id!r}")
    if not svc.store.log_in_sql:  # (embedded: the store's own table, done)
        svc.db.delete_keys([h])  # a store rebuilt from SQL must not bring it back
    svc.forget()
    return Response(status_code=204)


@router.post(
    "/v1/admin/key/rotate",
    operation_id="rotate_admin_key",
    tags=["projects"],
    response_model=AdminKeyRotated,
    responses=WRITES,
    dependencies=[require("admin", per_project=False)],
)
def rotate_admin(svc: ServiceDep) -> AdminKeyRotated:
    """A new admin key; every other admin key (the one that asked included) is revoked.
    With ``CROWDTALLY_ADMIN_KEY`` set, rotate by changing the setting and restarting."""
    settings = svc.settings
    if settings.admin_key:
        raise ApiError(
            409,
            "admin_key_configured",
            "the admin key is set by CROWDTALLY_ADMIN_KEY: change it and restart to rotate",
        )
    key_file = settings.data_dir / "admin.key" if settings.store == "embedded" else None
    all_keys = svc.store.list_keys(None)
    key, record, revoked = rotate_admin_key(svc.store, key_file)
    if not svc.store.log_in_sql:  # what a store rebuilt from SQL gets back: the new key only
        svc.db.put_keys({key_hash(key): record})
        svc.db.delete_keys(revoked)
    svc.forget()
    return AdminKeyRotated(
        api_key=key,
        key_id=record.key_id,
        revoked=[all_keys[h].key_id for h in revoked if h in all_keys],
    )
