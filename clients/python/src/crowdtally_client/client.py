"""``Client`` (sync) and ``AsyncClient`` (asyncio) over httpx; same methods, same arguments.

What each method sends and how it reads the answer is written once, in ``_requests``; the two
classes only carry it out: ``_call`` (one request, with retries), ``_run`` (a plan of several)
and ``_entries`` (a paged listing), plus what is I/O by nature (streaming, concurrency).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import httpx

from crowdtally_client import _core
from crowdtally_client import _requests as _req
from crowdtally_client._core import IdMode, LabelLike, RetryPolicy, TransportError
from crowdtally_client._requests import By, ExportFormat, Order, Page, Policy, Req
from crowdtally_client.models import (
    Accepted,
    BoundaryPage,
    CalibrationReport,
    Gold,
    Item,
    ItemPage,
    KeyCreated,
    PostResult,
    Prediction,
    Project,
    ProjectCreated,
    QueuePage,
    QueueSettings,
    Snapshot,
    Worker,
    WorkerPage,
)

if TYPE_CHECKING:
    import pandas as pd

    from crowdtally_client.frames import Aggregation, Dtypes

T = TypeVar("T")
X = TypeVar("X")


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
        max_pushback: float = 600.0,
        batch_size: int = _core.DEFAULT_BATCH,
        compress: bool = False,
    ) -> None:
        if not url.startswith(("http://", "https://")):  # (it was retried for seconds)
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        for name, value in (("timeout", timeout), ("backoff", backoff),
                            ("max_backoff", max_backoff), ("max_pushback", max_pushback)):  # fmt: skip
            if value is not None and not value >= 0:  # (failed at the first retry)
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries!r}")
        self.url = url.rstrip("/")
        self.key = key
        self.timeout = timeout
        self.retry = RetryPolicy(retries, backoff, max_backoff, max_pushback)
        self.batch_size = _core.check_batch(batch_size)
        self.compress = compress


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
        max_pushback: float = 600.0,
        batch_size: int = _core.DEFAULT_BATCH,
        compress: bool = False,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(
            url,
            key,
            timeout=timeout,
            retries=retries,
            backoff=backoff,
            max_backoff=max_backoff,
            max_pushback=max_pushback,
            batch_size=batch_size,
            compress=compress,
        )
        self._http = httpx.Client(
            base_url=self.url,
            headers=_core.headers(key, compress),
            timeout=timeout,
            transport=transport,
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
        _core.check_open(self._http.is_closed)
        tries = _core.Attempts(self.retry, method, self.url + path, idempotent)
        content, sent_as = _core.body(body, self.compress)
        while True:
            try:
                resp = self._http.request(
                    method, path, params=params, content=content, headers=sent_as
                )
            except httpx.TransportError as exc:
                time.sleep(tries.after_error(exc))
                continue
            wait = tries.after_answer(resp)
            if wait is None:
                return resp
            time.sleep(wait)

    def _call(self, req: Req[T]) -> T:
        """One request (with retries), its answer parsed."""
        resp = self.request(
            req.method, req.path, params=req.params, body=req.body, idempotent=req.idempotent
        )
        return _req.result(req, resp)

    def _run(self, plan: _req.Plan[T]) -> T:
        """Carry out a plan of several calls: each result (or error) goes back into the plan."""
        step = _req.resume(plan)
        while isinstance(step, Req):
            try:
                got = self._call(step)
            except Exception as err:
                step = _req.resume(plan, error=err)
            else:
                step = _req.resume(plan, got)
        return step.value

    def _entries(self, req: Req[Page[X]] | None) -> Iterator[X]:
        """A paged listing, one request a page as the caller iterates."""
        while req is not None:
            page = self._call(req)
            yield from page.entries
            req = page.next

    # ---------------------------------------------------------------- operations
    def healthz(self) -> bool:
        return self._call(_req.healthz())

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
        labels: Sequence[Any] | Any,
        *,
        hyperparameters: dict[str, Any] | None = None,
        worker_slots: int | None = None,
        dyadic: dict[str, Any] | None = None,
    ) -> ProjectCreated:
        return self._call(_req.create_project(name, labels, hyperparameters, worker_slots, dyadic))

    def list_projects(self) -> list[Project]:
        return self._call(_req.list_projects())

    def get_project(self, project: str) -> Project:
        return self._call(_req.get_project(project))

    def delete_project(self, project: str) -> None:
        self._call(_req.delete_project(project))

    def create_key(self, project: str, scope: Literal["read", "write"] = "read") -> KeyCreated:
        return self._call(_req.create_key(project, scope))

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
        """Post labels in blocks of ``batch_size`` (default 5,000; at most 10,000).

        Give every label an ``id`` (or ``ids="auto"``: a hash of item, worker, label, the
        position in ``labels`` and ``id_namespace``) and retried or re-run calls count once.
        Without ids, a block is only re-sent when the connection failed before sending it.
        """
        size = self.batch_size if batch_size is None else _core.check_batch(batch_size)
        return self._run(_req.post_labels(project, labels, ids, id_namespace, wait, size))

    def post_gold(
        self,
        project: str,
        gold: Iterable[Gold | dict[str, Any] | tuple[Any, Any]] | Any,
        *,
        wait: bool = False,
    ) -> PostResult:
        return self._run(_req.post_gold(project, gold, wait, self.batch_size))

    def refit(self, project: str, *, wait: bool = False) -> Accepted:
        return self._call(_req.refit(project, wait))

    # ---------------------------------------------------------------- items
    def get_item(self, project: str, item: Any) -> Item:
        return self._call(_req.get_item(project, item))

    def calibration(self, project: str) -> CalibrationReport:
        """The served posteriors scored on the project's gold items (cross-fitted)."""
        return self._call(_req.calibration(project))

    def list_items(
        self,
        project: str,
        *,
        cursor: str | None = None,
        limit: int = 100,
        min_probability: float = 0.0,
        max_probability: float = 1.0,
    ) -> ItemPage:
        return self._call(_req.list_items(project, cursor, limit, min_probability, max_probability))

    def iter_items(
        self,
        project: str,
        *,
        page_size: int = 1000,
        min_probability: float = 0.0,
        max_probability: float = 1.0,
    ) -> Iterator[Item]:
        """Every stored posterior, following the cursor (filtered pages may come back empty),
        ``page_size`` at a time (at most 1,000, the service's largest page)."""
        yield from self._entries(
            _req.item_pages(project, page_size, min_probability, max_probability)
        )

    def export(self, project: str, format: ExportFormat = "jsonl") -> Iterator[str]:
        """The service's streamed export, line by line (no retries: restart it on failure)."""
        req = _req.export(project, format)
        _core.check_open(self._http.is_closed)
        try:
            with self._http.stream(req.method, req.path, params=req.params) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    _core.raise_for(resp)
                lines = _core.Lines()
                for chunk in resp.iter_bytes():
                    yield from lines.feed(chunk)
                yield from lines.end()
        except httpx.TransportError as exc:
            raise TransportError(f"export of {project!r}: {exc!r}") from exc

    # ---------------------------------------------------------------- workers
    def get_worker(self, project: str, worker: Any) -> Worker:
        return self._call(_req.get_worker(project, worker))

    def list_workers(
        self,
        project: str,
        *,
        order: Order = "best",
        by: By = "informativeness",
        limit: int = 100,
        offset: int = 0,
    ) -> WorkerPage:
        return self._call(_req.list_workers(project, order, by, limit, offset))

    def iter_workers(
        self,
        project: str,
        *,
        order: Order = "best",
        by: By = "informativeness",
        page_size: int = 1000,
    ) -> Iterator[Worker]:
        yield from self._entries(_req.worker_pages(project, order, by, page_size))

    def worker_confusions(self, project: str, workers: Iterable[Any] | None = None) -> list[Worker]:
        """Workers with their confusion matrices (one GET each: the list omits them)."""
        if workers is None:  # (by name: labels arriving meanwhile reshuffle no page)
            every = (w.worker for w in self.iter_workers(project, order="name"))
            names = list(dict.fromkeys(every))
        else:
            names = list(workers)
        return [self.get_worker(project, w) for w in names]

    # ---------------------------------------------------------------- predictions
    def predict(
        self, project: str, pairs: Iterable[tuple[Any, Any] | Mapping[str, Any]] | Any
    ) -> list[Prediction]:
        """What each worker would answer on each item: ``pairs`` of (worker, item), sent in
        requests of at most 10,000 pairs; the answers in the same order."""
        return self._run(_req.predict(project, pairs))

    def boundary(
        self,
        project: str,
        *,
        worker: Any = None,
        item: Any = None,
        limit: int = 10,
        candidates: int = 200,
    ) -> BoundaryPage:
        """The (worker, item) pairs nearest the decision boundary (smallest h_min first) for
        one worker (among the items still queued) or one item (among the workers)."""
        return self._call(_req.boundary(project, worker, item, limit, candidates))

    # ---------------------------------------------------------------- queue
    def register_items(
        self, project: str, items: Iterable[Any], *, wait: bool = False
    ) -> PostResult:
        """Items with no labels yet (ids: text, integers, numpy scalars): they enter the
        queue. Sent in blocks of ``batch_size``; registering an item again changes nothing
        (``accepted`` still counts it: ``duplicates`` counts an item named twice in a block)."""
        return self._run(_req.register_items(project, items, wait, self.batch_size))

    def queue(self, project: str, *, limit: int = 10, worker: Any = None) -> QueuePage:
        """The items to label next, best first (finished items never appear), and the
        campaign's ``progress``. With ``worker``: not the items that worker labelled."""
        return self._call(_req.queue(project, limit, worker))

    def queue_settings(self, project: str) -> QueueSettings:
        return self._call(_req.queue_settings(project))

    def set_queue_settings(
        self,
        project: str,
        *,
        policy: Policy = "lookahead",
        target_confidence: float = 0.95,
        max_labels_per_item: int | None = None,
        budget: int | None = None,
        wait: bool = False,
    ) -> QueueSettings:
        """Replace the queue's settings (what is not given takes its default); answers the
        settings in force (with ``wait=True``, read back once the engine applied them)."""
        return self._call(
            _req.set_queue_settings(
                project, policy, target_confidence, max_labels_per_item, budget, wait
            )
        )

    # ---------------------------------------------------------------- snapshots
    def list_snapshots(self, project: str) -> list[Snapshot]:
        return self._call(_req.list_snapshots(project))

    # ---------------------------------------------------------------- pandas
    def to_pandas(
        self,
        project: str,
        *,
        errors: bool = True,
        like: pd.DataFrame | None = None,
        dtypes: Dtypes = "infer",
    ) -> Aggregation:
        """crowd-kit-shaped results: ``.probas`` (task x label), ``.labels`` (``agg_label``),
        ``.errors`` (``(worker, label)`` x true label; one GET per worker, skip with
        ``errors=False``), ``.gold`` (``true_label``). Needs pandas
        (``pip install 'crowdtally-client[pandas]'``).

        dtypes: ``task``, ``worker`` and ``label`` each come back as ``int64`` when all their
        values are plain integers (as ``pd.read_csv`` reads them), else as text; ``like=df``
        gives them the dtypes of ``df``'s columns; ``dtypes="str"`` keeps them text."""
        from crowdtally_client import frames

        types = frames.IdTypes.of(like, dtypes)
        classes = self.get_project(project).labels
        items = list(self.iter_items(project))
        workers = self.worker_confusions(project) if errors else None
        return frames.aggregation(items, classes, workers, types)


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
        max_pushback: float = 600.0,
        batch_size: int = _core.DEFAULT_BATCH,
        compress: bool = False,
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
            max_pushback=max_pushback,
            batch_size=batch_size,
            compress=compress,
        )
        if concurrency < 1:  # (a semaphore of 0 would wait for ever)
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self.concurrency = concurrency
        self._http = httpx.AsyncClient(
            base_url=self.url,
            headers=_core.headers(key, compress),
            timeout=timeout,
            transport=transport,
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
        _core.check_open(self._http.is_closed)
        tries = _core.Attempts(self.retry, method, self.url + path, idempotent)
        content, sent_as = _core.body(body, self.compress)
        while True:
            try:
                resp = await self._http.request(
                    method, path, params=params, content=content, headers=sent_as
                )
            except httpx.TransportError as exc:
                await asyncio.sleep(tries.after_error(exc))
                continue
            wait = tries.after_answer(resp)
            if wait is None:
                return resp
            await asyncio.sleep(wait)

    async def _call(self, req: Req[T]) -> T:
        resp = await self.request(
            req.method, req.path, params=req.params, body=req.body, idempotent=req.idempotent
        )
        return _req.result(req, resp)

    async def _run(self, plan: _req.Plan[T]) -> T:
        """As ``Client._run``."""
        step = _req.resume(plan)
        while isinstance(step, Req):
            try:
                got = await self._call(step)
            except Exception as err:
                step = _req.resume(plan, error=err)
            else:
                step = _req.resume(plan, got)
        return step.value

    async def _entries(self, req: Req[Page[X]] | None) -> AsyncIterator[X]:
        while req is not None:
            page = await self._call(req)
            for entry in page.entries:
                yield entry
            req = page.next

    async def healthz(self) -> bool:
        return await self._call(_req.healthz())

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Poll /healthz until the service answers (e.g. right after starting it)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if (await self._http.get("/healthz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TransportError(f"{self.url} did not answer /healthz within {timeout} s")
            await asyncio.sleep(0.1)

    async def create_project(
        self,
        name: str,
        labels: Sequence[Any] | Any,
        *,
        hyperparameters: dict[str, Any] | None = None,
        worker_slots: int | None = None,
        dyadic: dict[str, Any] | None = None,
    ) -> ProjectCreated:
        return await self._call(
            _req.create_project(name, labels, hyperparameters, worker_slots, dyadic)
        )

    async def list_projects(self) -> list[Project]:
        return await self._call(_req.list_projects())

    async def get_project(self, project: str) -> Project:
        return await self._call(_req.get_project(project))

    async def delete_project(self, project: str) -> None:
        await self._call(_req.delete_project(project))

    async def create_key(
        self, project: str, scope: Literal["read", "write"] = "read"
    ) -> KeyCreated:
        return await self._call(_req.create_key(project, scope))

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
        size = self.batch_size if batch_size is None else _core.check_batch(batch_size)
        return await self._run(_req.post_labels(project, labels, ids, id_namespace, wait, size))

    async def post_gold(
        self,
        project: str,
        gold: Iterable[Gold | dict[str, Any] | tuple[Any, Any]] | Any,
        *,
        wait: bool = False,
    ) -> PostResult:
        return await self._run(_req.post_gold(project, gold, wait, self.batch_size))

    async def refit(self, project: str, *, wait: bool = False) -> Accepted:
        return await self._call(_req.refit(project, wait))

    async def calibration(self, project: str) -> CalibrationReport:
        """The served posteriors scored on the project's gold items (cross-fitted)."""
        return await self._call(_req.calibration(project))

    async def get_item(self, project: str, item: Any) -> Item:
        return await self._call(_req.get_item(project, item))

    async def list_items(
        self,
        project: str,
        *,
        cursor: str | None = None,
        limit: int = 100,
        min_probability: float = 0.0,
        max_probability: float = 1.0,
    ) -> ItemPage:
        return await self._call(
            _req.list_items(project, cursor, limit, min_probability, max_probability)
        )

    async def iter_items(
        self,
        project: str,
        *,
        page_size: int = 1000,
        min_probability: float = 0.0,
        max_probability: float = 1.0,
    ) -> AsyncIterator[Item]:
        pages = _req.item_pages(project, page_size, min_probability, max_probability)
        async for item in self._entries(pages):
            yield item

    async def export(self, project: str, format: ExportFormat = "jsonl") -> AsyncIterator[str]:
        req = _req.export(project, format)
        _core.check_open(self._http.is_closed)
        try:
            async with self._http.stream(req.method, req.path, params=req.params) as resp:
                if resp.status_code >= 400:
                    await resp.aread()
                    _core.raise_for(resp)
                lines = _core.Lines()
                async for chunk in resp.aiter_bytes():
                    for line in lines.feed(chunk):
                        yield line
                for line in lines.end():
                    yield line
        except httpx.TransportError as exc:
            raise TransportError(f"export of {project!r}: {exc!r}") from exc

    async def get_worker(self, project: str, worker: Any) -> Worker:
        return await self._call(_req.get_worker(project, worker))

    async def list_workers(
        self,
        project: str,
        *,
        order: Order = "best",
        by: By = "informativeness",
        limit: int = 100,
        offset: int = 0,
    ) -> WorkerPage:
        return await self._call(_req.list_workers(project, order, by, limit, offset))

    async def iter_workers(
        self,
        project: str,
        *,
        order: Order = "best",
        by: By = "informativeness",
        page_size: int = 1000,
    ) -> AsyncIterator[Worker]:
        async for w in self._entries(_req.worker_pages(project, order, by, page_size)):
            yield w

    async def worker_confusions(
        self, project: str, workers: Iterable[Any] | None = None
    ) -> list[Worker]:
        """Workers with confusion matrices, ``concurrency`` GETs at a time."""
        if workers is None:  # (by name: labels arriving meanwhile reshuffle no page)
            every = [w.worker async for w in self.iter_workers(project, order="name")]
            names = list(dict.fromkeys(every))
        else:
            names = list(workers)
        gate, failed = asyncio.Semaphore(self.concurrency), asyncio.Event()

        async def one(name: str) -> Worker | None:
            async with gate:
                if failed.is_set():  # (one failed: the GETs not started yet are not sent;
                    return None  # those under way end, their connections closed as usual)
                try:
                    return await self.get_worker(project, name)
                except BaseException:
                    failed.set()
                    raise

        got = await asyncio.gather(*(one(w) for w in names), return_exceptions=True)
        for answer in got:
            if isinstance(answer, BaseException):
                raise answer
        return [w for w in got if isinstance(w, Worker)]

    async def predict(
        self, project: str, pairs: Iterable[tuple[Any, Any] | Mapping[str, Any]] | Any
    ) -> list[Prediction]:
        return await self._run(_req.predict(project, pairs))

    async def boundary(
        self,
        project: str,
        *,
        worker: Any = None,
        item: Any = None,
        limit: int = 10,
        candidates: int = 200,
    ) -> BoundaryPage:
        return await self._call(_req.boundary(project, worker, item, limit, candidates))

    async def register_items(
        self, project: str, items: Iterable[Any], *, wait: bool = False
    ) -> PostResult:
        return await self._run(_req.register_items(project, items, wait, self.batch_size))

    async def queue(self, project: str, *, limit: int = 10, worker: Any = None) -> QueuePage:
        return await self._call(_req.queue(project, limit, worker))

    async def queue_settings(self, project: str) -> QueueSettings:
        return await self._call(_req.queue_settings(project))

    async def set_queue_settings(
        self,
        project: str,
        *,
        policy: Policy = "lookahead",
        target_confidence: float = 0.95,
        max_labels_per_item: int | None = None,
        budget: int | None = None,
        wait: bool = False,
    ) -> QueueSettings:
        return await self._call(
            _req.set_queue_settings(
                project, policy, target_confidence, max_labels_per_item, budget, wait
            )
        )

    async def list_snapshots(self, project: str) -> list[Snapshot]:
        return await self._call(_req.list_snapshots(project))

    async def to_pandas(
        self,
        project: str,
        *,
        errors: bool = True,
        like: pd.DataFrame | None = None,
        dtypes: Dtypes = "infer",
    ) -> Aggregation:
        """As ``Client.to_pandas``."""
        from crowdtally_client import frames

        types = frames.IdTypes.of(like, dtypes)
        classes = (await self.get_project(project)).labels
        items = [x async for x in self.iter_items(project)]
        workers = await self.worker_confusions(project) if errors else None
        return frames.aggregation(items, classes, workers, types)


def parse_jsonl(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    for line in lines:
        if line.strip():
            yield json.loads(line)
