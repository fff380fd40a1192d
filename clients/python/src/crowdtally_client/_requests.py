"""Every operation of the client, written once, without I/O; ``Client`` and ``AsyncClient`` run them.

- A one-call operation is a ``Req``: method, path, query, JSON body, whether a retry is safe,
  and ``parse`` (the decoded JSON answer to the result). ``Client._call(req)`` and
  ``await AsyncClient._call(req)`` send it (with retries) and parse the answer.
- A paged listing is a ``Req`` whose result is a ``Page``: its entries and the request of the
  next page (None after the last), so the clients' iterators only follow ``Page.next``.
- An operation of several calls (label blocks, prediction chunks) is a ``Plan``: a generator
  that yields each ``Req`` and gets its result back (or its error raised where it yielded).
  ``Client._run`` and ``AsyncClient._run`` drive it, using ``resume``.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar
from urllib.parse import quote

import httpx

from crowdtally_client import _core, models
from crowdtally_client._core import ApiError, IdMode, LabelLike, TransportError

T = TypeVar("T")
U = TypeVar("U")
X = TypeVar("X")

Order = Literal["best", "worst", "name"]
By = Literal["informativeness", "accuracy"]
ExportFormat = Literal["jsonl", "csv"]
Policy = Literal["voi", "lookahead", "uncertainty", "entropy", "margin", "uniform"]
MAX_PAIRS = 10_000  # the service's limit per predictions request
MAX_ITEMS_PAGE = 1000  # the service's limit per page of items


@dataclass(frozen=True)
class Req(Generic[T]):
    """One call: ``parse`` turns the decoded JSON answer (None when empty, or not read with
    ``decode=False``) into the result. ``idempotent=None``: GET, HEAD, DELETE and PUT are
    retried as reads (``Client.request``)."""

    method: str
    path: str
    parse: Callable[[Any], T]
    params: dict[str, Any] | None = None
    body: Any = None
    idempotent: bool | None = None
    decode: bool = True

    def then(self, parse: Callable[[Any], U]) -> Req[U]:
        """The same call, parsed otherwise."""
        return Req(
            self.method, self.path, parse, self.params, self.body, self.idempotent, self.decode
        )


def result(req: Req[T], response: httpx.Response) -> T:
    """``req``'s result from the service's (successful) ``response``."""
    return req.parse(response.json() if req.decode and response.content else None)


@dataclass(frozen=True)
class Page(Generic[X]):
    """One page of a listing and the request of the next one (None: this was the last)."""

    entries: list[X]
    next: Req[Page[X]] | None


@dataclass(frozen=True)
class Done(Generic[T]):
    """What a finished plan returned."""

    value: T


Plan = Generator[Req[Any], Any, T]


def resume(plan: Plan[T], answer: Any = None, error: Exception | None = None) -> Req[Any] | Done[T]:
    """Run ``plan`` on to its next request, sending it ``answer`` (the result of its last one) or
    raising ``error`` where it waits; ``Done`` when it returns."""
    try:
        return plan.throw(error) if error is not None else plan.send(answer)
    except StopIteration as stop:
        return Done(stop.value)


def _p(name: str) -> str:
    """``name`` as one path segment: percent-encoded, a name of dots (``.``, ``..``) too, which
    an HTTP client would otherwise take for this or the parent folder of the path."""
    quoted = quote(name, safe="")
    return quoted.replace(".", "%2E") if quoted in (".", "..") else quoted


def _project(project: str) -> str:
    return f"/v1/projects/{_p(project)}"


def _wait(wait: bool) -> dict[str, Any] | None:
    return {"wait": "true"} if wait else None


def _unread(answer: Any) -> None:
    """For calls whose answer is not read (``decode=False``, the streamed ``export``)."""


def _each(model: Callable[[Any], T]) -> Callable[[Any], list[T]]:
    return lambda answer: [model(x) for x in answer]


# ---------------------------------------------------------------- projects
def healthz() -> Req[bool]:
    return Req("GET", "/healthz", lambda answer: bool(answer.get("status") == "ok"))


def create_project(
    name: str,
    labels: Any,
    hyperparameters: dict[str, Any] | None,
    worker_slots: int | None,
    dyadic: dict[str, Any] | None,
) -> Req[models.ProjectCreated]:
    body: dict[str, Any] = {"name": name, "labels": _core.label_names(labels)}
    if hyperparameters:
        body["hyperparameters"] = hyperparameters
    if worker_slots is not None:
        body["worker_slots"] = int(worker_slots)
    if dyadic is not None:
        body["dyadic"] = dyadic
    return Req(
        "POST", "/v1/projects", models.ProjectCreated.model_validate, body=body, idempotent=False
    )


def list_projects() -> Req[list[models.Project]]:
    return Req("GET", "/v1/projects", _each(models.Project.model_validate))


def get_project(project: str) -> Req[models.Project]:
    return Req("GET", _project(project), models.Project.model_validate)


def delete_project(project: str) -> Req[None]:
    return Req("DELETE", _project(project), _unread, decode=False)


def create_key(project: str, scope: str) -> Req[models.KeyCreated]:
    path = f"{_project(project)}/keys"
    return Req(
        "POST", path, models.KeyCreated.model_validate, body={"scope": scope}, idempotent=False
    )


# ---------------------------------------------------------------- labels
def _add(total: models.PostResult, got: models.Accepted) -> None:
    total.accepted += got.accepted
    total.duplicates += got.duplicates
    total.position = got.position
    total.applied = total.applied and got.applied
    total.blocks += 1


def _shift(err: ApiError, start: int, sent: models.PostResult) -> ApiError:
    """The error of the block that starts at entry ``start`` of the caller's input, its entry
    renumbered in that input (the service's message leads with the block's own index)."""
    if err.entry is not None:
        local, err.entry = err.entry, err.entry + start
        lead = f"entry {local}"
        rest = err.message[len(lead) :] if err.message.startswith(lead) else f": {err.message}"
        err.message = f"entry {err.entry} of the input{rest} (sent in the block from entry {start})"
    err.sent = sent
    return err


TOO_LARGE = frozenset({"block_too_large", "body_too_large"})
"""The 413s of a block the service took nothing of: too many labels, or too many bytes."""


def _halve(err: ApiError, size: int) -> bool:
    """Whether a block of ``size`` that got ``err`` goes again in halves: a 413 of a block the
    service took nothing of (its limits are lower than the client's blocks), not yet a single
    entry."""
    return err.status == 413 and err.code in TOO_LARGE and size > 1


def _post_blocks(
    path: str, entries: list[dict[str, Any]], size: int, wait: bool, idempotent: bool | None
) -> Plan[models.PostResult]:
    """One POST a block, in order, summed; an error names the entry of the whole input. A
    block the service finds too large (413 ``block_too_large`` or ``body_too_large``: its
    limits are lower) is sent again in halves, and the blocks after it as large.
    ``idempotent`` None: a block is when each of its entries carries an id."""
    total, params, start = models.PostResult(), _wait(wait), 0
    while start < len(entries):
        block = entries[start : start + size]
        again = all("id" in e for e in block) if idempotent is None else idempotent
        req = Req("POST", path, models.Accepted.model_validate, params, block, again)
        try:
            got = yield req
        except ApiError as err:
            if _halve(err, len(block)):
                size = len(block) // 2  # (a last block shorter than ``size`` halves itself)
                continue
            raise _shift(err, start, total) from None
        except TransportError as err:
            err.sent = total  # (what the blocks before it did)
            raise
        _add(total, got)
        start += len(block)
    return total


def post_labels(
    project: str,
    labels: Iterable[LabelLike] | Any,
    ids: IdMode,
    id_namespace: str,
    wait: bool,
    batch_size: int,
) -> Plan[models.PostResult]:
    entries = _core.prepare_labels(labels, ids, id_namespace)
    size = _core.check_batch(batch_size)
    return (yield from _post_blocks(f"{_project(project)}/labels", entries, size, wait, None))


def post_gold(
    project: str,
    gold: Iterable[models.Gold | dict[str, Any] | tuple[Any, Any]] | Any,
    wait: bool,
    batch_size: int,
) -> Plan[models.PostResult]:
    entries = _core.prepare_gold(gold)
    return (yield from _post_blocks(f"{_project(project)}/gold", entries, batch_size, wait, False))


def refit(project: str, wait: bool) -> Req[models.Accepted]:
    path = f"{_project(project)}/refit"
    return Req("POST", path, models.Accepted.model_validate, _wait(wait), idempotent=False)


# ---------------------------------------------------------------- items
def get_item(project: str, item: Any) -> Req[models.Item]:
    path = f"{_project(project)}/items/{_p(_core.as_text(item, 'item'))}"
    return Req("GET", path, models.Item.model_validate)


def calibration(project: str) -> Req[models.CalibrationReport]:
    return Req("GET", f"{_project(project)}/calibration", models.CalibrationReport.model_validate)


def list_items(
    project: str,
    cursor: str | None,
    limit: int,
    min_probability: float,
    max_probability: float,
) -> Req[models.ItemPage]:
    params: dict[str, Any] = {
        "limit": limit,
        "min_probability": min_probability,
        "max_probability": max_probability,
    }
    if cursor:
        params["cursor"] = cursor
    return Req("GET", f"{_project(project)}/items", models.ItemPage.model_validate, params)


def item_pages(
    project: str,
    page_size: int,
    min_probability: float,
    max_probability: float,
    cursor: str | None = None,
) -> Req[Page[models.Item]]:
    """``list_items`` from ``cursor`` on, following the cursor (filtered pages may be empty);
    pages of at most MAX_ITEMS_PAGE items, the service's limit."""
    page_size = min(page_size, MAX_ITEMS_PAGE)

    def parse(answer: Any) -> Page[models.Item]:
        page = models.ItemPage.model_validate(answer)
        after = page.next_cursor
        if not after:
            return Page(page.items, None)
        return Page(
            page.items, item_pages(project, page_size, min_probability, max_probability, after)
        )

    return list_items(project, cursor, page_size, min_probability, max_probability).then(parse)


def export(project: str, format: ExportFormat) -> Req[None]:
    """The streamed export (the clients read it line by line, without retries)."""
    return Req("GET", f"{_project(project)}/export", _unread, {"format": format}, decode=False)


# ---------------------------------------------------------------- workers
def get_worker(project: str, worker: Any) -> Req[models.Worker]:
    path = f"{_project(project)}/workers/{_p(_core.as_text(worker, 'worker'))}"
    return Req("GET", path, models.Worker.model_validate)


def list_workers(
    project: str, order: Order, by: By, limit: int, offset: int
) -> Req[models.WorkerPage]:
    params = {"order": order, "by": by, "limit": limit, "offset": offset}
    return Req("GET", f"{_project(project)}/workers", models.WorkerPage.model_validate, params)


def worker_pages(
    project: str, order: Order, by: By, page_size: int, offset: int = 0
) -> Req[Page[models.Worker]]:
    """``list_workers`` from ``offset`` on, until ``total`` workers came (or an empty page)."""

    def parse(answer: Any) -> Page[models.Worker]:
        page = models.WorkerPage.model_validate(answer)
        after = offset + len(page.workers)
        if not page.workers or after >= page.total:
            return Page(page.workers, None)
        return Page(page.workers, worker_pages(project, order, by, page_size, after))

    return list_workers(project, order, by, page_size, offset).then(parse)


# ---------------------------------------------------------------- predictions
def _predictions(answer: Any) -> list[models.Prediction]:
    return [models.Prediction.model_validate(p) for p in answer["predictions"]]


def predict(
    project: str, pairs: Iterable[tuple[Any, Any] | Mapping[str, Any]] | Any
) -> Plan[list[models.Prediction]]:
    """Requests of at most ``MAX_PAIRS`` pairs (retried: they only read); answers in order. A
    request the service finds too large (413 ``body_too_large``: its byte limit is lower, or
    the ids are long) is sent again in halves, and the requests after it as large."""
    body = _core.prepare_pairs(pairs)
    path = f"{_project(project)}/predictions"
    out: list[models.Prediction] = []
    size, lo = MAX_PAIRS, 0
    while lo < len(body):
        chunk = body[lo : lo + size]
        try:
            got = yield Req("POST", path, _predictions, body=chunk, idempotent=True)
        except ApiError as err:
            if _halve(err, len(chunk)):
                size = len(chunk) // 2  # (a last request shorter than ``size`` halves itself)
                continue
            raise
        out.extend(got)
        lo += len(chunk)
    return out


def boundary(
    project: str, worker: Any, item: Any, limit: int, candidates: int
) -> Req[models.BoundaryPage]:
    if (worker is None) == (item is None):
        raise ValueError("give exactly one of worker and item")
    params: dict[str, Any] = {"limit": limit, "candidates": candidates}
    if worker is not None:
        params["worker"] = _core.as_text(worker, "worker")
    else:
        params["item"] = _core.as_text(item, "item")
    return Req("GET", f"{_project(project)}/boundary", models.BoundaryPage.model_validate, params)


# ---------------------------------------------------------------- queue
def register_items(
    project: str, items: Iterable[Any], wait: bool, batch_size: int
) -> Plan[models.PostResult]:
    """Items without labels, into the queue; registering an item again changes nothing, so
    the blocks are retried as reads."""
    if isinstance(items, str | bytes):
        raise ValueError(f"items must be a collection of ids, got {items!r}")
    entries = [{"item": _core.as_text(x, f"item {n}")} for n, x in enumerate(items)]
    return (yield from _post_blocks(f"{_project(project)}/items", entries, batch_size, wait, True))


def queue(project: str, limit: int, worker: Any) -> Req[models.QueuePage]:
    params: dict[str, Any] = {"limit": limit}
    if worker is not None:
        params["worker"] = _core.as_text(worker, "worker")
    return Req("GET", f"{_project(project)}/queue", models.QueuePage.model_validate, params)


def queue_settings(project: str) -> Req[models.QueueSettings]:
    path = f"{_project(project)}/queue/settings"
    return Req("GET", path, models.QueueSettings.model_validate)


def set_queue_settings(
    project: str,
    policy: Policy,
    target_confidence: float,
    max_labels_per_item: int | None,
    budget: int | None,
    wait: bool,
) -> Req[models.QueueSettings]:
    """A PUT (retried as a read): it replaces the settings; answers the settings in force."""
    body = {
        "policy": policy,
        "target_confidence": float(target_confidence),
        "max_labels_per_item": None if max_labels_per_item is None else int(max_labels_per_item),
        "budget": None if budget is None else int(budget),
    }
    path = f"{_project(project)}/queue/settings"
    return Req("PUT", path, models.QueueSettings.model_validate, _wait(wait), body)


# ---------------------------------------------------------------- snapshots
def list_snapshots(project: str) -> Req[list[models.Snapshot]]:
    return Req("GET", f"{_project(project)}/snapshots", _each(models.Snapshot.model_validate))
