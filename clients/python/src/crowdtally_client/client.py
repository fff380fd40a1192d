"""``Client`` (sync) and ``AsyncClient`` (asyncio) over httpx; same methods, same arguments."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

import httpx

from crowdtally_client import _core
from crowdtally_client._core import (
    ApiError,
    IdMode,
    LabelLike,
    RetryPolicy,
    TransportError,
)
from crowdtally_client.models import (
    Accepted,
    BoundaryPage,
    Gold,
    Item,
    ItemPage,
    KeyCreated,
    PostResult,
    Prediction,
    Project,
    ProjectCreated,
    Snapshot,
    Worker,
    WorkerPage,
)

if TYPE_CHECKING:
    from crowdtally_client.frames import Aggregation

Order = Literal["best", "worst"]
By = Literal["informativeness", "accuracy"]
ExportFormat = Literal["jsonl", "csv"]
MAX_PAIRS = 10_000  # the service's limit per predictions request


def _p(name: str) -> str:
    return quote(name, safe="")


def _project_body(
    name: str,
    labels: list[str],
    hyperparameters: dict[str, Any] | None,
    worker_slots: int | None,
    dyadic: dict[str, Any] | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "labels": list(labels)}
    if hyperparameters:
        body["hyperparameters"] = hyperparameters
    if worker_slots is not None:
        body["worker_slots"] = worker_slots
    if dyadic is not None:
        body["dyadic"] = dyadic
    return body


def _pairs(pairs: Iterable[tuple[str, str] | dict[str, str]]) -> list[dict[str, str]]:
    out = [p if isinstance(p, dict) else {"worker": p[0], "item": p[1]} for p in pairs]
    return out


def _boundary_params(
    worker: str | None, item: str | None, limit: int, candidates: int
) -> dict[str, Any]:
    if (worker is None) == (item is None):
        raise ValueError("give exactly one of worker and item")
    params: dict[str, Any] = {"limit": limit, "candidates": candidates}
    params.update({"worker": worker} if worker is not None else {"item": item})
    return params


def _add(total: PostResult, got: Accepted) -> None:
    total.accepted += got.accepted
    total.duplicates += got.duplicates
    total.position = got.position
    total.applied = total.applied and got.applied
    total.blocks += 1


def _shift(err: ApiError, start: int, sent: PostResult) -> ApiError:
    if err.entry is not None:
        err.entry += start
        err.message = f"{err.message} (entry {err.entry} of the input; block at {start})"
    err.sent = sent
    return err


class _Base:
    def __init__(
        self,
        url: str = _core.DEFAULT_URL,
        key: str | None = None,
        *,
        timeout: float = 60.0,
        retries: int = 5,
        backoff: float = 0.25,
        max_backoff: float = 8.0,
        batch_size: int = _core.DEFAULT_BATCH,
    ) -> None:
        self.url = url.rstrip("/")
        self.key = key
        self.timeout = timeout
        self.retry = RetryPolicy(retries, backoff, max_backoff)
        self.batch_size = _core.check_batch(batch_size)

    def _prepare(
        self, labels: Any, ids: IdMode, namespace: str, batch_size: int | None
    ) -> tuple[list[tuple[int, list[dict[str, Any]]]], bool]:
        entries = _core.prepare_labels(labels, ids, namespace)
        size = _core.check_batch(batch_size or self.batch_size)
        return _core.blocks(entries, size), all("id" in e for e in entries)


class Client(_Base):
    """A synchronous client. ``key`` is an admin key or a project key (read or write).

    >>> with Client("http://127.0.0.1:8000", key) as c:
    ...     c.post_labels("faces", [("img1", "ann", "asian")], ids="auto", wait=True)
    """

    def __init__(
        self,
        url: str = _core.DEFAULT_URL,
        key: str | None = None,
        *,
        timeout: float = 60.0,
        retries: int = 5,
        backoff: float = 0.25,
        max_backoff: float = 8.0,
        batch_size: int = _core.DEFAULT_BATCH,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(
            url,
            key,
            timeout=timeout,
            retries=retries,
            backoff=backoff,
            max_backoff=max_backoff,
            batch_size=batch_size,
        )
        self._http = httpx.Client(
            base_url=self.url, headers=_core.headers(key), timeout=timeout, transport=transport
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # ---------------------------------------------------------------- plumbing
    def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        body: Any = None,
        idempotent: bool | None = None,
    ) -> httpx.Response:
        """One call with retries; raises ``ApiError`` on an error answer."""
        if idempotent is None:
            idempotent = method in ("GET", "HEAD", "DELETE", "PUT")
        content = _core.dumps(body) if body is not None else None
        attempt = 0
        while True:
            try:
                resp = self._http.request(method, path, params=params, content=content)
            except httpx.TransportError as exc:
                if not self.retry.should_retry_exc(exc, attempt, idempotent):
                    raise TransportError(f"{method} {self.url}{path}: {exc!r}") from exc
                time.sleep(self.retry.delay(attempt, None))
                attempt += 1
                continue
            if self.retry.should_retry_status(resp.status_code, attempt, idempotent):
                time.sleep(self.retry.delay(attempt, resp))
                attempt += 1
                continue
            _core.raise_for(resp)
            return resp

    def _json(self, method: str, path: str, **kw: Any) -> Any:
        resp = self.request(method, path, **kw)
        return resp.json() if resp.content else None

    # ---------------------------------------------------------------- operations
    def healthz(self) -> bool:
        return bool(self._json("GET", "/healthz").get("status") == "ok")

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Poll /healthz until the service answers (e.g. right after starting it)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self._http.get("/healthz").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TransportError(f"{self.url} did not answer /healthz within {timeout} s")
            time.sleep(0.1)

    # ---------------------------------------------------------------- projects
    def create_project(
        self,
        name: str,
        labels: list[str],
        *,
        hyperparameters: dict[str, Any] | None = None,
        worker_slots: int | None = None,
        dyadic: dict[str, Any] | None = None,
    ) -> ProjectCreated:
        body = _project_body(name, labels, hyperparameters, worker_slots, dyadic)
        return ProjectCreated.model_validate(
            self._json("POST", "/v1/projects", body=body, idempotent=False)
        )

    def list_projects(self) -> list[Project]:
        return [Project.model_validate(p) for p in self._json("GET", "/v1/projects")]

    def get_project(self, project: str) -> Project:
        return Project.model_validate(self._json("GET", f"/v1/projects/{_p(project)}"))

    def delete_project(self, project: str) -> None:
        self.request("DELETE", f"/v1/projects/{_p(project)}")

    def create_key(self, project: str, scope: Literal["read", "write"] = "read") -> KeyCreated:
        return KeyCreated.model_validate(
            self._json(
                "POST", f"/v1/projects/{_p(project)}/keys", body={"scope": scope}, idempotent=False
            )
        )

    # ---------------------------------------------------------------- labels
    def post_labels(
        self,
        project: str,
        labels: Iterable[LabelLike] | Any,
        *,
        ids: IdMode = None,
        id_namespace: str = "",
        wait: bool = False,
        batch_size: int | None = None,
    ) -> PostResult:
        """Post labels in blocks of ``batch_size`` (default 1,000; at most 10,000).

        Give every label an ``id`` (or ``ids="auto"``: a hash of item, worker, label, the
        position in ``labels`` and ``id_namespace``) and retried or re-run calls count once.
        Without ids, a block is only re-sent when the connection failed before sending it.
        """
        chunks, idempotent = self._prepare(labels, ids, id_namespace, batch_size)
        total = PostResult()
        for start, block in chunks:
            try:
                got = self._json(
                    "POST",
                    f"/v1/projects/{_p(project)}/labels",
                    params={"wait": "true"} if wait else None,
                    body=block,
                    idempotent=idempotent,
                )
            except ApiError as err:
                raise _shift(err, start, total) from None
            _add(total, Accepted.model_validate(got))
        return total

    def post_gold(
        self,
        project: str,
        gold: Iterable[Gold | dict[str, Any] | tuple[str, str]],
        *,
        wait: bool = False,
    ) -> PostResult:
        entries = _core.prepare_gold(gold)
        total = PostResult()
        for start, block in _core.blocks(entries, self.batch_size):
            try:
                got = self._json(
                    "POST",
                    f"/v1/projects/{_p(project)}/gold",
                    params={"wait": "true"} if wait else None,
                    body=block,
                    idempotent=False,
                )
            except ApiError as err:
                raise _shift(err, start, total) from None
            _add(total, Accepted.model_validate(got))
        return total

    def refit(self, project: str, *, wait: bool = False) -> Accepted:
        return Accepted.model_validate(
            self._json(
                "POST",
                f"/v1/projects/{_p(project)}/refit",
                params={"wait": "true"} if wait else None,
                idempotent=False,
            )
        )

    # ---------------------------------------------------------------- items
    def get_item(self, project: str, item: str) -> Item:
        return Item.model_validate(
            self._json("GET", f"/v1/projects/{_p(project)}/items/{_p(item)}")
        )

    def list_items(
        self,
        project: str,
        *,
        cursor: str | None = None,
        limit: int = 100,
        min_probability: float = 0.0,
        max_probability: float = 1.0,
    ) -> ItemPage:
        params: dict[str, Any] = {
            "limit": limit,
            "min_probability": min_probability,
            "max_probability": max_probability,
        }
        if cursor:
            params["cursor"] = cursor
        return ItemPage.model_validate(
            self._json("GET", f"/v1/projects/{_p(project)}/items", params=params)
        )

    def iter_items(
        self,
        project: str,
        *,
        page_size: int = 1000,
        min_probability: float = 0.0,
        max_probability: float = 1.0,
    ) -> Iterator[Item]:
        """Every stored posterior, following the cursor (filtered pages may come back empty)."""
        cursor: str | None = None
        while True:
            page = self.list_items(
                project,
                cursor=cursor,
                limit=page_size,
                min_probability=min_probability,
                max_probability=max_probability,
            )
            yield from page.items
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def export(self, project: str, format: ExportFormat = "jsonl") -> Iterator[str]:
        """The service's streamed export, line by line (no retries: restart it on failure)."""
        try:
            with self._http.stream(
                "GET", f"/v1/projects/{_p(project)}/export", params={"format": format}
            ) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    _core.raise_for(resp)
                yield from resp.iter_lines()
        except httpx.TransportError as exc:
            raise TransportError(f"export of {project!r}: {exc!r}") from exc

    # ---------------------------------------------------------------- workers
    def get_worker(self, project: str, worker: str) -> Worker:
        return Worker.model_validate(
            self._json("GET", f"/v1/projects/{_p(project)}/workers/{_p(worker)}")
        )

    def list_workers(
        self,
        project: str,
        *,
        order: Order = "best",
        by: By = "informativeness",
        limit: int = 100,
        offset: int = 0,
    ) -> WorkerPage:
        params = {"order": order, "by": by, "limit": limit, "offset": offset}
        return WorkerPage.model_validate(
            self._json("GET", f"/v1/projects/{_p(project)}/workers", params=params)
        )

    def iter_workers(
        self,
        project: str,
        *,
        order: Order = "best",
        by: By = "informativeness",
        page_size: int = 1000,
    ) -> Iterator[Worker]:
        offset = 0
        while True:
            page = self.list_workers(project, order=order, by=by, limit=page_size, offset=offset)
            yield from page.workers
            offset += len(page.workers)
            if not page.workers or offset >= page.total:
                return

    def worker_confusions(self, project: str, workers: Iterable[str] | None = None) -> list[Worker]:
        """Workers with their confusion matrices (one GET each: the list omits them)."""
        names = (
            list(workers) if workers is not None else [w.worker for w in self.iter_workers(project)]
        )
        return [self.get_worker(project, w) for w in names]

    # ---------------------------------------------------------------- predictions
    def predict(
        self, project: str, pairs: Iterable[tuple[str, str] | dict[str, str]]
    ) -> list[Prediction]:
        """What each worker would answer on each item: ``pairs`` of (worker, item), sent in
        requests of at most 10,000 pairs; the answers in the same order."""
        body, out = _pairs(pairs), []
        for lo in range(0, len(body), MAX_PAIRS):
            chunk = body[lo : lo + MAX_PAIRS]
            url = f"/v1/projects/{_p(project)}/predictions"
            got = self._json("POST", url, body=chunk, idempotent=True)  # reads only
            out.extend(Prediction.model_validate(p) for p in got["predictions"])
        return out

    def boundary(
        self,
        project: str,
        *,
        worker: str | None = None,
        item: str | None = None,
        limit: int = 10,
        candidates: int = 200,
    ) -> BoundaryPage:
        """The (worker, item) pairs nearest the decision boundary (smallest h_min first) for
        one worker (among the items still queued) or one item (among the workers)."""
        params = _boundary_params(worker, item, limit, candidates)
        return BoundaryPage.model_validate(
            self._json("GET", f"/v1/projects/{_p(project)}/boundary", params=params)
        )

    # ---------------------------------------------------------------- snapshots
    def list_snapshots(self, project: str) -> list[Snapshot]:
        return [
            Snapshot.model_validate(s)
            for s in self._json("GET", f"/v1/projects/{_p(project)}/snapshots")
        ]

    # ---------------------------------------------------------------- pandas
    def to_pandas(self, project: str, *, errors: bool = True) -> Aggregation:
        """crowd-kit-shaped results: ``.probas`` (task x label), ``.labels`` (``agg_label``),
        ``.errors`` (``(worker, label)`` x true label; one GET per worker, skip with
        ``errors=False``). Needs pandas (``pip install 'crowdtally-client[pandas]'``)."""
        from crowdtally_client import frames

        classes = self.get_project(project).labels
        items = list(self.iter_items(project))
        workers = self.worker_confusions(project) if errors else None
        return frames.aggregation(items, classes, workers)


class AsyncClient(_Base):
    """The asyncio twin of ``Client`` (``async with AsyncClient(url, key) as c: ...``)."""

    def __init__(
        self,
        url: str = _core.DEFAULT_URL,
        key: str | None = None,
        *,
        timeout: float = 60.0,
        retries: int = 5,
        backoff: float = 0.25,
        max_backoff: float = 8.0,
        batch_size: int = _core.DEFAULT_BATCH,
        concurrency: int = 8,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(
            url,
            key,
            timeout=timeout,
            retries=retries,
            backoff=backoff,
            max_backoff=max_backoff,
            batch_size=batch_size,
        )
        self.concurrency = concurrency
        self._http = httpx.AsyncClient(
            base_url=self.url, headers=_core.headers(key), timeout=timeout, transport=transport
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        body: Any = None,
        idempotent: bool | None = None,
    ) -> httpx.Response:
        if idempotent is None:
            idempotent = method in ("GET", "HEAD", "DELETE", "PUT")
        content = _core.dumps(body) if body is not None else None
        attempt = 0
        while True:
            try:
                resp = await self._http.request(method, path, params=params, content=content)
            except httpx.TransportError as exc:
                if not self.retry.should_retry_exc(exc, attempt, idempotent):
                    raise TransportError(f"{method} {self.url}{path}: {exc!r}") from exc
                await asyncio.sleep(self.retry.delay(attempt, None))
                attempt += 1
                continue
            if self.retry.should_retry_status(resp.status_code, attempt, idempotent):
                await asyncio.sleep(self.retry.delay(attempt, resp))
                attempt += 1
                continue
            _core.raise_for(resp)
            return resp

    async def _json(self, method: str, path: str, **kw: Any) -> Any:
        resp = await self.request(method, path, **kw)
        return resp.json() if resp.content else None

    async def healthz(self) -> bool:
        return bool((await self._json("GET", "/healthz")).get("status") == "ok")

    async def create_project(
        self,
        name: str,
        labels: list[str],
        *,
        hyperparameters: dict[str, Any] | None = None,
        worker_slots: int | None = None,
        dyadic: dict[str, Any] | None = None,
    ) -> ProjectCreated:
        body = _project_body(name, labels, hyperparameters, worker_slots, dyadic)
        return ProjectCreated.model_validate(
            await self._json("POST", "/v1/projects", body=body, idempotent=False)
        )

    async def list_projects(self) -> list[Project]:
        return [Project.model_validate(p) for p in await self._json("GET", "/v1/projects")]

    async def get_project(self, project: str) -> Project:
        return Project.model_validate(await self._json("GET", f"/v1/projects/{_p(project)}"))

    async def delete_project(self, project: str) -> None:
        await self.request("DELETE", f"/v1/projects/{_p(project)}")

    async def create_key(
        self, project: str, scope: Literal["read", "write"] = "read"
    ) -> KeyCreated:
        return KeyCreated.model_validate(
            await self._json(
                "POST", f"/v1/projects/{_p(project)}/keys", body={"scope": scope}, idempotent=False
            )
        )

    async def post_labels(
        self,
        project: str,
        labels: Iterable[LabelLike] | Any,
        *,
        ids: IdMode = None,
        id_namespace: str = "",
        wait: bool = False,
        batch_size: int | None = None,
    ) -> PostResult:
        """As ``Client.post_labels``; blocks go one after another (the log keeps their order)."""
        chunks, idempotent = self._prepare(labels, ids, id_namespace, batch_size)
        total = PostResult()
        for start, block in chunks:
            try:
                got = await self._json(
                    "POST",
                    f"/v1/projects/{_p(project)}/labels",
                    params={"wait": "true"} if wait else None,
                    body=block,
                    idempotent=idempotent,
                )
            except ApiError as err:
                raise _shift(err, start, total) from None
            _add(total, Accepted.model_validate(got))
        return total

    async def post_gold(
        self,
        project: str,
        gold: Iterable[Gold | dict[str, Any] | tuple[str, str]],
        *,
        wait: bool = False,
    ) -> PostResult:
        entries = _core.prepare_gold(gold)
        total = PostResult()
        for start, block in _core.blocks(entries, self.batch_size):
            try:
                got = await self._json(
                    "POST",
                    f"/v1/projects/{_p(project)}/gold",
                    params={"wait": "true"} if wait else None,
                    body=block,
                    idempotent=False,
                )
            except ApiError as err:
                raise _shift(err, start, total) from None
            _add(total, Accepted.model_validate(got))
        return total

    async def refit(self, project: str, *, wait: bool = False) -> Accepted:
        return Accepted.model_validate(
            await self._json(
                "POST",
                f"/v1/projects/{_p(project)}/refit",
                params={"wait": "true"} if wait else None,
                idempotent=False,
            )
        )

    async def get_item(self, project: str, item: str) -> Item:
        return Item.model_validate(
            await self._json("GET", f"/v1/projects/{_p(project)}/items/{_p(item)}")
        )

    async def list_items(
        self,
        project: str,
        *,
        cursor: str | None = None,
        limit: int = 100,
        min_probability: float = 0.0,
        max_probability: float = 1.0,
    ) -> ItemPage:
        params: dict[str, Any] = {
            "limit": limit,
            "min_probability": min_probability,
            "max_probability": max_probability,
        }
        if cursor:
            params["cursor"] = cursor
        return ItemPage.model_validate(
            await self._json("GET", f"/v1/projects/{_p(project)}/items", params=params)
        )

    async def iter_items(
        self,
        project: str,
        *,
        page_size: int = 1000,
        min_probability: float = 0.0,
        max_probability: float = 1.0,
    ) -> AsyncIterator[Item]:
        cursor: str | None = None
        while True:
            page = await self.list_items(
                project,
                cursor=cursor,
                limit=page_size,
                min_probability=min_probability,
                max_probability=max_probability,
            )
            for item in page.items:
                yield item
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def export(self, project: str, format: ExportFormat = "jsonl") -> AsyncIterator[str]:
        try:
            async with self._http.stream(
                "GET", f"/v1/projects/{_p(project)}/export", params={"format": format}
            ) as resp:
                if resp.status_code >= 400:
                    await resp.aread()
                    _core.raise_for(resp)
                async for line in resp.aiter_lines():
                    yield line
        except httpx.TransportError as exc:
            raise TransportError(f"export of {project!r}: {exc!r}") from exc

    async def get_worker(self, project: str, worker: str) -> Worker:
        return Worker.model_validate(
            await self._json("GET", f"/v1/projects/{_p(project)}/workers/{_p(worker)}")
        )

    async def list_workers(
        self,
        project: str,
        *,
        order: Order = "best",
        by: By = "informativeness",
        limit: int = 100,
        offset: int = 0,
    ) -> WorkerPage:
        params = {"order": order, "by": by, "limit": limit, "offset": offset}
        return WorkerPage.model_validate(
            await self._json("GET", f"/v1/projects/{_p(project)}/workers", params=params)
        )

    async def iter_workers(
        self,
        project: str,
        *,
        order: Order = "best",
        by: By = "informativeness",
        page_size: int = 1000,
    ) -> AsyncIterator[Worker]:
        offset = 0
        while True:
            page = await self.list_workers(
                project, order=order, by=by, limit=page_size, offset=offset
            )
            for w in page.workers:
                yield w
            offset += len(page.workers)
            if not page.workers or offset >= page.total:
                return

    async def worker_confusions(
        self, project: str, workers: Iterable[str] | None = None
    ) -> list[Worker]:
        """Workers with confusion matrices, ``concurrency`` GETs at a time."""
        if workers is None:
            names = [w.worker async for w in self.iter_workers(project)]
        else:
            names = list(workers)
        gate = asyncio.Semaphore(self.concurrency)

        async def one(name: str) -> Worker:
            async with gate:
                return await self.get_worker(project, name)

        return list(await asyncio.gather(*(one(w) for w in names)))

    async def predict(
        self, project: str, pairs: Iterable[tuple[str, str] | dict[str, str]]
    ) -> list[Prediction]:
        body, out = _pairs(pairs), []
        for lo in range(0, len(body), MAX_PAIRS):
            chunk = body[lo : lo + MAX_PAIRS]
            url = f"/v1/projects/{_p(project)}/predictions"
            got = await self._json("POST", url, body=chunk, idempotent=True)  # reads only
            out.extend(Prediction.model_validate(p) for p in got["predictions"])
        return out

    async def boundary(
        self,
        project: str,
        *,
        worker: str | None = None,
        item: str | None = None,
        limit: int = 10,
        candidates: int = 200,
    ) -> BoundaryPage:
        params = _boundary_params(worker, item, limit, candidates)
        return BoundaryPage.model_validate(
            await self._json("GET", f"/v1/projects/{_p(project)}/boundary", params=params)
        )

    async def list_snapshots(self, project: str) -> list[Snapshot]:
        return [
            Snapshot.model_validate(s)
            for s in await self._json("GET", f"/v1/projects/{_p(project)}/snapshots")
        ]

    async def to_pandas(self, project: str, *, errors: bool = True) -> Aggregation:
        """As ``Client.to_pandas``."""
        from crowdtally_client import frames

        classes = (await self.get_project(project)).labels
        items = [x async for x in self.iter_items(project)]
        workers = await self.worker_confusions(project) if errors else None
        return frames.aggregation(items, classes, workers)


def parse_jsonl(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    for line in lines:
        if line.strip():
            yield json.loads(line)
