"""Import and export: files to and from a running service, over HTTP (the commands
``crowdtally import`` and ``crowdtally export`` are in ``app.cli.transfer``).

Only HTTP: they work against any crowdtally service (``--url``), local or remote,
with a key from ``--key`` or ``CROWDTALLY_KEY``. Imports are resumable: every label carries an
id derived from its source (``app.io.importers``), so a re-run after a failure, or an import of a
later export that repeats earlier rows, counts each answer once.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar
from urllib.parse import quote

from app.io import importers
from app.io.importers import Record
from app.io.input import TRUTH_HEADER_HINT, InputError, label_order, refuse_duplicate_columns
from app.io.replaced import replaced

if TYPE_CHECKING:  # imported by the functions that speak HTTP: the command line stays light
    import httpx

    from app.io.answer_table import AnswerTable

T = TypeVar("T")
IMPORT_BATCH = 5000
"""Labels per POST of an import: against a local embedded service, 500,000 answers went in 5.7-6.0
s in blocks of 5,000 or 10,000, 7.4-8.5 s in blocks of 1,000 (the engine learns queued blocks
together either way; fewer requests, fewer log entries)."""
DEFAULT_URL = "http://127.0.0.1:8000"
RETRY_STATUS = {429, 500, 502, 503, 504, 507}
KEPT_NOTHING = 507
"""``store_full``: the service kept nothing of the request, so it is sent again (after its
``Retry-After``, spending the retries) even where a 5xx is not."""
RETRIES: ContextVar[int] = ContextVar("crowdtally_transfer_retries", default=5)
PUSHBACK_WAIT_S = 600.0
"""How long in all a request refused with 429 is sent again before the command gives up."""
COMPRESS: ContextVar[bool] = ContextVar("crowdtally_transfer_compress", default=False)
"""Whether bodies of ``COMPRESS_FROM`` bytes or more are sent gzipped, and answers asked for
gzipped (``import --compress``, ``export --compress``)."""
COMPRESS_FROM = 4096


@contextmanager
def compressed(on: bool) -> Iterator[None]:
    """``COMPRESS`` set to ``on`` for the commands run inside (and as it was after)."""
    token = COMPRESS.set(on)
    try:
        yield
    finally:
        COMPRESS.reset(token)


class ServiceError(ValueError):
    """The service refused a request or could not be reached (``crowdtally`` exits 2)."""


def _http(url: str, key: str | None) -> httpx.Client:
    import httpx

    headers = {"Content-Type": "application/json", "User-Agent": "crowdtally-cli"}
    headers["Accept-Encoding"] = "gzip" if COMPRESS.get() else "identity"  # (on one machine,
    if key:  # gzip costs more time than the bytes it saves)
        headers["Authorization"] = f"Bearer {key}"
    return httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=120.0)


# Tests swap this for a factory of in-process clients (fastapi's TestClient is an httpx.Client).
make_http: Callable[[str, str | None], httpx.Client] = _http


def _p(name: str) -> str:
    """``name`` as one path segment: percent-encoded, a name of dots (``.``, ``..``) too, which
    an HTTP client would otherwise take for this or the parent folder of the path."""
    quoted = quote(name, safe="")
    return quoted.replace(".", "%2E") if quoted in (".", "..") else quoted


def _error_text(resp: httpx.Response) -> tuple[str, int | None]:
    try:
        err = resp.json()["error"]
        return f"{resp.status_code} {err['code']}: {err['message']}", err.get("entry")
    except (ValueError, KeyError, TypeError):
        return f"{resp.status_code}: {resp.text[:300]}", None


def _code(resp: httpx.Response) -> str | None:
    """The error code of a refusal (``ApiError``'s), if it has one."""
    try:
        return str(resp.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return None


def call(
    http: httpx.Client,
    method: str,
    path: str,
    *,
    body: Any = None,
    content: bytes | None = None,
    params: dict[str, Any] | None = None,
    retry: bool = True,
    retries: int | None = None,
) -> httpx.Response:
    """A request with a JSON ``body`` (or ``content``, JSON already); connection errors and 5xx
    are retried with back-off when ``retry`` (``retries`` times, default ``RETRIES``: 5,
    ``--retries`` of the commands), and a 507 (the store full: nothing kept) whatever
    ``retry`` says. A 429 (push-back: the service took nothing) is sent again
    after its ``Retry-After`` whatever ``retry`` says, without spending the retries, for up to
    PUSHBACK_WAIT_S of waiting in all: a long import waits for a busy engine."""
    import httpx

    retries = RETRIES.get() if retries is None else retries
    if body is not None:
        content = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if content is not None else None
    if content is not None and COMPRESS.get() and len(content) >= COMPRESS_FROM:
        content = gzip.compress(content, compresslevel=1, mtime=0)
        headers = {**(headers or {}), "Content-Encoding": "gzip"}
    attempt, pushed_back = 0, 0.0
    while True:
        last = attempt >= retries
        try:
            resp = http.request(method, path, content=content, params=params, headers=headers)
        except httpx.TransportError as exc:
            if last or not retry:
                raise ServiceError(f"cannot reach {http.base_url}: {exc}") from None
            wait = None
        else:
            if resp.status_code == 429:
                if pushed_back >= PUSHBACK_WAIT_S:
                    return resp
                wait = _retry_after(resp)
                wait = wait if wait is not None else _backoff(min(attempt, 5))
                pushed_back += max(wait, 0.1)  # (a Retry-After of 0 again and again still ends)
                time.sleep(wait)
                continue
            again = retry or resp.status_code == KEPT_NOTHING
            if last or not (again and resp.status_code in RETRY_STATUS):
                return resp
            wait = _retry_after(resp)
        time.sleep(wait if wait is not None else _backoff(attempt))
        attempt += 1


def _backoff(attempt: int) -> float:
    return min(0.25 * 2.0**attempt, 8.0) * (0.5 + random.random() / 2)


def _retry_after(resp: httpx.Response) -> float | None:
    """The answer's ``Retry-After`` in seconds (0 to 8), None unless a number."""
    try:
        seconds = float(resp.headers.get("retry-after", ""))
    except ValueError:
        return None
    return min(max(seconds, 0.0), 8.0) if math.isfinite(seconds) else None


def _check(resp: httpx.Response, what: str) -> None:
    if resp.status_code >= 400:
        hint = (
            " (--url is the service's address, without /v1)" if _code(resp) == "not_found" else ""
        )
        raise ServiceError(f"{what}: {_error_text(resp)[0]}{hint}")


# ---------------------------------------------------------------------- import


@dataclass
class ImportResult:
    format: str
    labels: int
    accepted: int
    duplicates: int
    gold: int
    skipped: int
    blocks: int
    created: bool
    seconds: float
    unread: tuple[str, ...] = ()
    """Columns of the file that no answer read."""
    gold_unanswered: int = 0
    """Items of the truth file that no answer of the file is about (posted as gold alone)."""


def _ensure_project(
    http: httpx.Client,
    project: str,
    create_with: list[str] | None,
    check: Callable[[list[str]], None],
) -> bool:
    """Whether the project was made here: one not there yet is created with ``create_with``
    once ``check`` has accepted those (a file it refuses leaves no project); ``check`` accepts
    the classes of one that is."""
    made = False
    resp = call(http, "GET", f"/v1/projects/{_p(project)}")
    if resp.status_code == 404 and _code(resp) == "unknown_project":
        if create_with is None:
            raise ServiceError(f"no project named {project!r}: create it, or pass "
                               "--create-with-labels a,b,c (admin key)")  # fmt: skip
        check(create_with)
        resp = call(http, "POST", "/v1/projects", body={"name": project, "labels": create_with})
        if resp.status_code != 409:  # (409: made meanwhile by another, used as it is)
            _check(resp, f"creating project {project!r}")
            made = True
        resp = call(http, "GET", f"/v1/projects/{_p(project)}")
    _check(resp, f"project {project!r}")
    check(resp.json()["labels"])
    return made


def _remove_if_empty(http: httpx.Client, project: str) -> None:
    """Delete a project this import made when nothing reached its log (the service refused
    the first block: a weight above its limit, say), so that no empty project is left."""
    resp = call(http, "GET", f"/v1/projects/{_p(project)}")
    if resp.status_code == 200 and resp.json()["stats"]["log_end"] == 0:
        call(http, "DELETE", f"/v1/projects/{_p(project)}")


def refuse_unknown_labels(
    path: Path, answers: AnswerTable, gold: list[Record], classes: list[str], project: str
) -> None:
    """An InputError naming the first answer, then gold record, of ``path`` whose label is not
    one of ``classes``."""
    unknown = answers.first_label_not_in(classes)
    if unknown is not None:
        label = answers.labels[unknown].as_py()
        raise InputError(path, answers.line(unknown),
                         f"label {label!r} is not one of project {project!r}'s labels {classes}")  # fmt: skip
    refuse_unknown_gold(path, gold, classes, project)


AUTO_LABELS_HINT = (" (--create-with-labels auto takes the labels the answers use; to add a"
                    " class no answer has, list every label: --create-with-labels a,b,c)")  # fmt: skip


def refuse_unknown_gold(
    path: Path, gold: list[Record], classes: list[str], project: str, hint: str = ""
) -> None:
    """An InputError naming the first gold record of ``path`` whose label is not a class."""
    for r in gold:
        if r.label not in classes:
            if r.line == 1 and [g.label for g in gold].count(r.label) == 1:
                hint += TRUTH_HEADER_HINT
            raise InputError(path, r.line,
                             f"gold label {r.label!r} is not one of project {project!r}'s labels "
                             f"{classes}{hint}")  # fmt: skip


def unanswered_truth(
    path: Path, known: list[Record], answers: AnswerTable, gold: list[Record]
) -> int:
    """How many of a truth file's items no answer (nor the answer file's own gold) is about;
    an InputError when that is all of them: the wrong file, or its items renamed, whose gold
    would only make items that no one answered."""
    items = {r.item for r in known}
    unanswered = items - {r.item for r in gold}
    unanswered -= answers.answered(unanswered)
    if items and unanswered == items:
        raise InputError(path, None, f"none of its {len(items)} items is among the answers' items")
    return len(unanswered)


TOO_LARGE = frozenset({"block_too_large", "body_too_large"})
"""The 413s of a block the service took nothing of: too many labels, or too many bytes."""


def _post_answers(
    http: httpx.Client,
    project: str,
    path: Path,
    answers: AnswerTable,
    batch_size: int,
    wait_last: bool,
    advance: Callable[[int], None],
) -> tuple[int, int, int, int]:
    """Post the answers in blocks of ``batch_size``, halved while the service finds a block too
    large (413 block_too_large or body_too_large: nothing of it was taken); returns (accepted,
    duplicates, blocks, the block size that went through)."""
    accepted = duplicates = n_blocks = sent = 0
    while sent < len(answers):
        for lo, hi, body in answers.bodies(batch_size, first=sent):
            params = {"wait": "true"} if wait_last and hi == len(answers) else None
            resp = call(
                http, "POST", f"/v1/projects/{_p(project)}/labels", content=body, params=params
            )
            if resp.status_code == 413 and batch_size > 1 and _code(resp) in TOO_LARGE:
                batch_size //= 2  # (the blocks from this one on)
                break
            if resp.status_code in (401, 403):  # the key, not the file
                text, _ = _error_text(resp)
                raise InputError("--key", None, f"{text} (give a write key of project "
                                 f"{project!r} with --key or CROWDTALLY_KEY)")  # fmt: skip
            if resp.status_code >= 500:  # the service, not the file (507: the store full)
                text, _ = _error_text(resp)
                raise ServiceError(f"{path}: the service could not take this block: {text} "
                                   f"({accepted + duplicates} labels were accepted before it; run "
                                   "the import again once it can: those are counted once)")  # fmt: skip
            if resp.status_code >= 400:
                text, entry = _error_text(resp)
                line = answers.line(lo + entry) if entry is not None and entry < hi - lo else None
                raise InputError(path, line, f"the service refused this block: {text} "
                                 f"({accepted + duplicates} labels were accepted before it; mend the file and run the "
                                 "import again: those are counted once)")  # fmt: skip
            got = resp.json()
            n_blocks += 1
            accepted += got["accepted"]
            duplicates += got["duplicates"]
            sent = hi
            advance(hi - lo)
    return accepted, duplicates, n_blocks, batch_size


def run_import(
    http: httpx.Client,
    path: Path,
    project: str,
    *,
    format: str = "auto",
    mapping: dict[str, str] | None = None,
    create_with: list[str] | None = None,
    auto_labels: bool = False,
    truth: Path | None = None,
    batch_size: int = IMPORT_BATCH,
    wait: bool = True,
    progress: bool = False,
    header: bool = True,
) -> ImportResult:
    """Read ``path`` and post its labels (then gold) to ``project``; returns the tallies. A
    block the service finds too large (its ``CROWDTALLY_MAX_BLOCK_LABELS`` is lower) is sent
    again in halves, and the blocks after it as large. Without ``header``, a CSV or TSV
    file's first line is an answer too (``importers.HEADERLESS``)."""
    t0 = time.perf_counter()
    answers, gold = importers.read_answers(path, format, mapping, header)
    if (twice := answers.id_given_twice()) is not None:
        row, earlier = twice
        raise InputError(path, answers.line(row),
                         f"id {answers.ids[row].as_py()!r} names another answer on line "
                         f"{answers.line(earlier)}: an id names one answer (the service would "
                         "take this one for a repeat of it and drop it)")  # fmt: skip
    known: list[Record] = []  # (the truth file's, checked against the classes with its lines)
    unanswered = 0
    if truth is not None:
        from app.io.triples import truth_rows  # pyarrow: loaded only for a truth file

        known = [Record(i, "", lab, None, gold=True, line=n) for n, i, lab in truth_rows(truth)]
    if auto_labels:  # (a truth file's labels are checked against these, not added: "Yes"
        labels = answers.label_names() | {r.label for r in gold}  # beside "yes" is a typo)
        create_with = label_order(labels)
    if truth is not None:
        in_file = {r.item: r for r in gold}
        for r in known:
            if (other := in_file.get(r.item)) is not None and other.label != r.label:
                raise InputError(truth, r.line, f"item {r.item!r} has gold {r.label!r} here and "
                                 f"{other.label!r} in {path}, line {other.line}")  # fmt: skip
        unanswered = unanswered_truth(truth, known, answers, gold)

    def check(classes: list[str]) -> None:
        refuse_unknown_labels(path, answers, gold, classes, project)
        if truth is not None:
            hint = AUTO_LABELS_HINT if auto_labels and classes == create_with else ""
            refuse_unknown_gold(truth, known, classes, project, hint)

    made = _ensure_project(http, project, create_with, check)
    gold += known
    with _progress(progress, len(answers), f"import {path.name}") as advance:
        wait_last = wait and not gold
        try:
            accepted, duplicates, n_blocks, batch_size = _post_answers(
                http, project, path, answers, batch_size, wait_last, advance
            )
        except BaseException:
            if made:
                _remove_if_empty(http, project)
            raise
    if gold:
        # Gold has no ids in the API; posting it again sets the same answers (idempotent: the
        # engine replaces an item's earlier gold, its workers' gold tallies with it).
        items = {r.item: r.label for r in gold}
        body_all = [{"item": i, "label": lab} for i, lab in items.items()]
        for k in range(0, len(body_all), batch_size):
            last = k + batch_size >= len(body_all)
            resp = call(
                http,
                "POST",
                f"/v1/projects/{_p(project)}/gold",
                body=body_all[k : k + batch_size],
                params={"wait": "true"} if wait and last else None,
                retry=False,
            )
            _check(resp, "posting gold")
    return ImportResult(
        format=answers.format,
        labels=len(answers),
        accepted=accepted,
        duplicates=duplicates,
        gold=len({r.item for r in gold}),
        skipped=answers.skipped,
        blocks=n_blocks,
        created=create_with is not None,
        seconds=time.perf_counter() - t0,
        unread=answers.unread,
        gold_unanswered=unanswered,
    )


class _NoProgress:
    def __enter__(self) -> Callable[[int], None]:
        return lambda n: None

    def __exit__(self, *exc: object) -> None:
        return None


class _RichProgress:
    def __init__(self, total: int, title: str) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            transient=False,
        )
        self.task = self.progress.add_task(title, total=total)

    def __enter__(self) -> Callable[[int], None]:
        self.progress.start()
        return lambda n: self.progress.advance(self.task, n)

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()


def _progress(show: bool, total: int, title: str) -> _NoProgress | _RichProgress:
    return _RichProgress(total, title) if show else _NoProgress()


# ---------------------------------------------------------------------- export

WHAT = ("posteriors", "labels", "workers")
WORKER_FIELDS = (
    "worker",
    "accuracy",
    "informativeness",
    "n_labels",
    "gold_labels",
    "gold_accuracy",
)


def _copy_export(http: httpx.Client, project: str, format: str, out: BinaryIO) -> int:
    """The service's export written to ``out`` as it streams in, each line ending in a line
    feed (the CSV's CRLF too); returns the lines written."""
    lines, held = 0, b""
    for chunk in _export(http, project, format, lambda resp: resp.iter_bytes()):
        chunk = held + chunk
        held = b"\r" if chunk.endswith(b"\r") else b""  # (its line feed may come next)
        text = chunk[: len(chunk) - len(held)].replace(b"\r\n", b"\n")
        out.write(text)
        lines += text.count(b"\n")
    out.write(held)
    return lines


def _lines(http: httpx.Client, project: str, format: str) -> Iterator[str]:
    return _export(http, project, format, lambda resp: resp.iter_lines())


def _export(
    http: httpx.Client, project: str, format: str, parts: Callable[[httpx.Response], Iterator[T]]
) -> Iterator[T]:
    """The ``parts`` of the service's export as it streams in (an error answer raised)."""
    with http.stream(
        "GET", f"/v1/projects/{_p(project)}/export", params={"format": format}
    ) as resp:
        if resp.status_code >= 400:
            resp.read()
            _check(resp, f"export of {project!r}")
        yield from parts(resp)


def _workers(http: httpx.Client, project: str, confusion: bool) -> Iterator[dict[str, Any]]:
    offset = 0
    while True:
        resp = call(
            http,
            "GET",
            f"/v1/projects/{_p(project)}/workers",
            params={"limit": 10000, "offset": offset, "order": "best"},
        )
        _check(resp, f"workers of {project!r}")
        page = resp.json()
        for w in page["workers"]:
            if confusion:
                one = call(http, "GET", f"/v1/projects/{_p(project)}/workers/{_p(w['worker'])}")
                _check(one, f"worker {w['worker']!r}")
                w = one.json()
            yield w
        offset += len(page["workers"])
        if not page["workers"] or offset >= page["total"]:
            return


def run_export(
    http: httpx.Client,
    project: str,
    out: Path,
    *,
    what: str = "posteriors",
    format: str = "auto",
    confusion: bool = False,
    progress: bool = False,
) -> int:
    """Write ``what`` of ``project`` to ``out``; returns the number of rows written."""
    format, classes = _export_start(http, project, out, what, format)
    with replaced(out, ".part") as tmp:
        if format == "parquet":
            n = _write_parquet(http, project, tmp, what, classes, confusion)
        else:
            with tmp.open("wb") as sink:
                n = _write_export(http, project, sink, what, format, classes, confusion)
    return n


def print_export(
    http: httpx.Client,
    project: str,
    out: BinaryIO,
    *,
    what: str = "posteriors",
    format: str = "auto",
    confusion: bool = False,
) -> int:
    """``run_export`` as CSV (``auto``) or JSONL to a stream (standard output); returns the
    number of rows written."""
    refuse_parquet_to_stdout(format)
    format, classes = _export_start(http, project, Path("-"), what, format)
    n = _write_export(http, project, out, what, format, classes, confusion)
    out.flush()
    return n


def refuse_parquet_to_stdout(format: str) -> None:
    """An InputError for ``--format parquet`` to standard output (a binary file, written
    beside its name first)."""
    if format == "parquet":
        raise InputError("--format", None, "Parquet is not written to standard output: "
                         "give -o FILE")  # fmt: skip


def _export_start(
    http: httpx.Client, project: str, out: Path, what: str, format: str
) -> tuple[str, list[str]]:
    """The export's format (``export_format``) and the project's classes, checked."""
    if what not in WHAT:
        raise InputError("--what", None, f"one of {', '.join(WHAT)}, got {what!r}")
    format = export_format(format, out)
    resp = call(http, "GET", f"/v1/projects/{_p(project)}")
    _check(resp, f"project {project!r}")
    classes: list[str] = resp.json()["labels"]
    if format == "parquet" and what == "posteriors":
        columns = (*_HEAD, *_TAIL, "computed_at")
        refuse_duplicate_columns("--format", classes, columns, "export CSV or JSONL")
    return format, classes


def _write_export(
    http: httpx.Client,
    project: str,
    sink: BinaryIO,
    what: str,
    format: str,
    classes: list[str],
    confusion: bool,
) -> int:
    """Write the export as CSV or JSONL to ``sink``; the number of rows written."""
    if what == "posteriors":
        n = _copy_export(http, project, format, sink)
        return n - (1 if format == "csv" and n else 0)  # (the CSV's header)
    n = 0
    f = io.TextIOWrapper(sink, encoding="utf-8", newline="")
    try:
        if what == "labels":
            writer = csv.writer(f) if format == "csv" else None
            if writer:
                writer.writerow(["item", "label", "probability", "n_labels", "gold"])
            for line in _lines(http, project, "jsonl"):
                if not line.strip():
                    continue
                x = json.loads(line)
                best = {k: x[k] for k in ("item", "label", "probability", "n_labels", "gold")}
                if writer:
                    writer.writerow([*list(best.values())[:4], best["gold"] or ""])
                else:
                    f.write(_jsonl(best))
                n += 1
        else:
            fields = list(WORKER_FIELDS)
            conf_cols = _confusion_columns(classes) if confusion else []
            writer = csv.writer(f) if format == "csv" else None
            if writer:
                writer.writerow(fields + conf_cols)
            for w in _workers(http, project, confusion):
                if writer:
                    row: list[Any] = [w[k] if w[k] is not None else "" for k in fields]
                    if confusion:
                        row += [w["confusion"][t][a] for t in classes for a in classes]
                    writer.writerow(row)
                else:
                    keep = fields + (["confusion"] if confusion else [])
                    f.write(_jsonl({k: w.get(k) for k in keep}))
                n += 1
    finally:
        f.flush()
        f.detach()  # (``sink`` stays open: its owner closes it)
    return n


EXPORT_FORMATS = ("auto", "csv", "jsonl", "parquet")


def export_format(format: str, out: Path) -> str:
    """The format of an export: ``auto`` by the file's name (``.parquet``, ``.jsonl`` or
    ``.ndjson``, else CSV)."""
    if format not in EXPORT_FORMATS:
        raise InputError("--format", None, f"one of {', '.join(EXPORT_FORMATS)}, got {format!r}")
    if format != "auto":
        return format
    suffix = out.suffix.lower()
    return (
        "parquet" if suffix == ".parquet" else "jsonl" if suffix in (".jsonl", ".ndjson") else "csv"
    )


def _write_parquet(
    http: httpx.Client, project: str, path: Path, what: str, classes: list[str], confusion: bool
) -> int:
    """``what`` as a Parquet file: the columns of the CSV export, typed (posteriors as
    float64, not rounded); the service's JSONL export read by pyarrow's JSON reader."""
    import pyarrow as pa  # (only for Parquet)
    import pyarrow.parquet as pq

    if what == "workers":
        rows = [_worker_row(w, classes, confusion) for w in _workers(http, project, confusion)]
        kinds = {"worker": pa.string(), "n_labels": pa.int64(), "gold_labels": pa.int64()}
        cells = [*WORKER_FIELDS, *(_confusion_columns(classes) if confusion else [])]
        schema = pa.schema([(name, kinds.get(name, pa.float64())) for name in cells])
        table = pa.Table.from_pylist(rows, schema=schema)  # (typed when empty, or all null)
    else:
        items = _items_table(http, project, classes)
        posterior = items.column("posterior").combine_chunks()
        tail = [*_TAIL, "computed_at"] if what == "posteriors" else list(_TAIL)
        columns = {k: items.column(k) for k in _HEAD}
        if what == "posteriors":
            columns |= {c: posterior.field(c) for c in classes}
        table = pa.table(columns | {k: items.column(k) for k in tail})
    pq.write_table(table, path)
    return int(table.num_rows)


_HEAD, _TAIL = ("item", "label", "probability"), ("n_labels", "gold")
"""The Parquet export's columns before and after the posteriors' (``computed_at`` last, with
them)."""


def _items_table(http: httpx.Client, project: str, classes: list[str]) -> Any:
    """Every item of the JSONL export as a pyarrow table (the posterior a struct by class)."""
    import pyarrow as pa
    import pyarrow.json as pj

    schema = pa.schema([
        ("item", pa.string()), ("label", pa.string()), ("probability", pa.float64()),
        ("posterior", pa.struct([(c, pa.float64()) for c in classes])),
        ("n_labels", pa.int64()), ("gold", pa.string()), ("computed_at", pa.string()),
    ])  # fmt: skip
    with http.stream(
        "GET", f"/v1/projects/{_p(project)}/export", params={"format": "jsonl"}
    ) as resp:
        if resp.status_code >= 400:
            resp.read()
            _check(resp, f"export of {project!r}")
        body = b"".join(resp.iter_bytes())
    if not body.strip():
        return schema.empty_table()
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    return pj.read_json(io.BytesIO(body), parse_options=options)


def _worker_row(w: dict[str, Any], classes: list[str], confusion: bool) -> dict[str, Any]:
    row = {k: w[k] for k in WORKER_FIELDS}
    if confusion:
        row |= {f"{t}->{a}": w["confusion"][t][a] for t in classes for a in classes}
    return row


def _confusion_columns(classes: list[str]) -> list[str]:
    """The confusion matrix's columns, ``true->answered``, row by row."""
    return [f"{t}->{a}" for t in classes for a in classes]


# ---------------------------------------------------------------------- calibration


def fetch_calibration(http: httpx.Client, project: str) -> dict[str, Any]:
    """The project's calibration report (``GET /v1/projects/{p}/calibration``)."""
    resp = call(http, "GET", f"/v1/projects/{_p(project)}/calibration")
    _check(resp, f"calibration of {project!r}")
    report: dict[str, Any] = resp.json()
    return report


def calibration_text(report: dict[str, Any]) -> str:
    """The report as a reader wants it: the figures, then the reliability bins."""
    head = f"calibration in force: rho {report['rho']:g}, eps {report['eps']:g}"
    if not report["n_gold"]:
        return head + "\nno gold items with answers: post gold answers to score the posteriors"
    lines = [
        head,
        f"{report['n_gold']} gold items, each scored from its answers, calibrated without its "
        "own gold (5 folds)",
        f"accuracy {100 * report['accuracy']:.2f}%  ECE {report['ece']:.2f} points  "
        f"NLL {report['nll']:.4f}  Brier {report['brier']:.4f}",
        f"{'confidence':>12} {'items':>7} {'mean conf.':>11} {'accuracy':>9}",
    ]
    for b in report["bins"]:
        if b["n"]:
            lines.append(
                f"{b['lower']:5.2f}-{b['upper']:4.2f} {b['n']:>9} {b['confidence']:>11.3f} "
                f"{b['accuracy']:>9.3f}"
            )
    return "\n".join(lines)


def _jsonl(row: dict[str, Any]) -> str:
    """One JSONL line as the service writes its own (compact, UTF-8: an id "w\u00e9" is "wé")."""
    return json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n"
