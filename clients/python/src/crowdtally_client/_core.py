"""What the sync and async clients share: label preparation, batching, retries, errors."""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import random
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from email.utils import mktime_tz, parsedate_tz
from typing import Any, Literal

import httpx

from crowdtally_client.models import Gold, Label

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_BATCH = 5_000
"""Labels a block by default (fewer requests and log entries than 1,000: docs/client.md); a
service that takes fewer labels or bytes a block answers 413 and the block goes again in
halves."""
MAX_BATCH = 10_000  # the service's default limit of labels per block
RETRY_STATUS = frozenset({429, 500, 502, 503, 504, 507})
KEPT_NOTHING = 507
"""``store_full``: the service kept nothing of the request, so it is sent again even where a
5xx is not (a label block without ids)."""
PUSHBACK_FLOOR = 0.1
"""Seconds each 429 counts for at least against ``max_pushback`` (a ``Retry-After: 0``
answered again and again still ends)."""

LabelLike = Label | Mapping[str, Any] | Sequence[Any]
IdMode = Literal["auto"] | None


class CrowdtallyError(Exception):
    """Base class of the client's errors."""


class ApiError(CrowdtallyError):
    """The service answered with an error: ``status``, ``code``, ``message``, ``entry``, ``field``.

    For a ``post_labels`` call split into blocks, ``entry`` is the index in the caller's whole
    input, and ``sent`` holds what the blocks before the failing one did (already applied).
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        entry: int | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(status, code, message, entry, field)
        self.status, self.code, self.message, self.entry, self.field = (
            status,
            code,
            message,
            entry,
            field,
        )
        self.sent: Any = None

    def __str__(self) -> str:  # (``entry`` and ``message`` change when a split call reports)
        return f"{self.status} {self.code}: {self.message}"


def check_open(closed: bool) -> None:
    """A closed client is a ``CrowdtallyError`` (httpx's was a bare ``RuntimeError``)."""
    if closed:
        raise CrowdtallyError("this client is closed: make a new one (or use it in its with block)")


class TransportError(CrowdtallyError):
    """The service could not be reached (after the retries). For a ``post_labels`` call split
    into blocks, ``sent`` holds what the blocks before the failing one did (already applied;
    the failing block may or may not have been taken: send it again with ids)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.sent: Any = None


def auto_id(item: str, worker: str, label: str, position: int, namespace: str = "") -> str:
    """A deterministic label id: the same input at the same position gives the same id."""
    text = "\x1f".join((namespace, item, worker, label, str(position)))
    return "auto-" + hashlib.sha256(text.encode()).hexdigest()[:40]


def as_text(value: Any, what: str = "id") -> str:
    """An item, worker or label as the service stores it: text. numpy and pandas scalars count
    as their Python value (``np.int64(3)`` is ``"3"``, as the int 3 is)."""
    if isinstance(value, str):
        return str(value)  # (np.str_ too)
    item = getattr(value, "item", None)  # numpy scalars (np.int64, np.bool_, ...)
    if callable(item) and getattr(value, "ndim", None) == 0:
        value = item()
    if isinstance(value, bytes | Iterable) and not isinstance(value, str):
        raise ValueError(f"{what} must be one value, got {value!r}")
    if _is_missing(value):
        raise ValueError(f"{what} is missing ({value!r})")
    return str(value)


def _is_missing(value: Any) -> bool:
    """None, NaN, pandas' NA and NaT: a missing cell of a data frame."""
    if value is None:
        return True
    try:
        return bool(value != value)  # NaN, NaT
    except (TypeError, ValueError):  # pd.NA refuses bool()
        return True


def label_names(labels: Any) -> list[str]:
    """A project's labels from a list, tuple, numpy array, pandas Series or Index (e.g.
    ``np.unique(df.label)``, ``df.label.unique()``), each as text."""
    if isinstance(labels, str | bytes) or not isinstance(labels, Iterable):
        raise ValueError(f"labels must be a list of labels, got {labels!r}")
    values = labels.tolist() if hasattr(labels, "tolist") else list(labels)
    return [as_text(x, "a label") for x in values]


FRAME_ROWS = 65_536
"""A DataFrame's rows are read this many at a time: the dicts pandas makes of a slice are
dropped once checked, not held beside the labels made of the whole frame (1M rows: about 0.9
GB of them)."""


def _from_frame(labels: Any) -> Iterator[dict[str, Any]] | None:
    """A pandas DataFrame (crowd-kit's ``task, worker, label`` or ``item, worker, label``):
    its rows as dicts, a slice at a time."""
    columns = getattr(labels, "columns", None)
    if columns is None or not hasattr(labels, "to_dict"):
        return None
    cols = set(columns)
    item_col = "task" if "task" in cols else "item"
    missing = {item_col, "worker", "label"} - cols
    if missing:
        raise ValueError(f"the DataFrame lacks the columns {sorted(missing)}")
    keep = [c for c in (item_col, "worker", "label", "id", "weight") if c in cols]
    frame = labels[keep].rename(columns={"task": "item"})

    def rows() -> Iterator[dict[str, Any]]:
        for lo in range(0, len(frame), FRAME_ROWS):
            yield from frame.iloc[lo : lo + FRAME_ROWS].to_dict("records")

    return rows()


def prepare_labels(
    labels: Iterable[LabelLike] | Any, ids: IdMode = None, namespace: str = ""
) -> list[dict[str, Any]]:
    """Labels as JSON-ready dicts; accepts models, mappings, (item, worker, label[, weight])
    tuples or a pandas DataFrame. ``ids="auto"`` fills missing ids with ``auto_id``."""
    if ids not in (None, "auto"):
        raise ValueError("ids must be None or 'auto'")
    if isinstance(labels, (Mapping, Label)):  # (a mapping iterates over its keys)
        raise ValueError("labels: give a list of labels, not one label")
    rows = _from_frame(labels)
    source: Iterable[Any] = rows if rows is not None else labels
    out: list[dict[str, Any]] = []
    for n, x in enumerate(source):
        if isinstance(x, Label):
            d = x.model_dump(exclude_none=True)
        elif isinstance(x, Mapping):
            d = {  # (a missing id or weight is none given; a missing item is refused below)
                k: v for k, v in x.items() if not (k in ("id", "weight") and _is_missing(v))
            }
        elif isinstance(x, Sequence) and not isinstance(x, str) and 3 <= len(x) <= 4:
            d = {"item": x[0], "worker": x[1], "label": x[2]}
            if len(x) == 4 and x[3] is not None:  # (None: no weight, as in a mapping)
                d["weight"] = x[3]
        else:
            raise ValueError(f"label {n}: expected a Label, a mapping or a tuple, got {x!r}")
        for k in ("item", "worker", "label", "id"):
            if k in d:
                d[k] = as_text(d[k], f"label {n}: {k}")
        if "weight" in d:
            try:
                d["weight"] = float(d["weight"])
            except (TypeError, ValueError):
                raise ValueError(f"label {n}: weight {d['weight']!r} is not a number") from None
            if not math.isfinite(d["weight"]) or d["weight"] < 0:  # (inf is no JSON number)
                raise ValueError(f"label {n}: weight {d['weight']!r} is not a finite number >= 0")
            if d["weight"] == 1.0:
                del d["weight"]
        if ids == "auto" and "id" not in d:
            try:
                d["id"] = auto_id(d["item"], d["worker"], d["label"], n, namespace)
            except KeyError as exc:
                raise ValueError(f"label {n}: no {exc.args[0]!r}") from None
        out.append(d)
    return out


def prepare_pairs(pairs: Any) -> list[dict[str, str]]:
    """(worker, item) pairs as JSON-ready dicts: 2-tuples, mappings with ``worker`` and
    ``item``, or a pandas DataFrame with the columns ``worker`` and ``item`` (or ``task``)."""
    columns = getattr(pairs, "columns", None)
    if columns is not None and hasattr(pairs, "to_dict"):
        cols = set(columns)
        item = "task" if "task" in cols else "item"
        if not {"worker", item} <= cols:
            raise ValueError("a DataFrame of pairs needs the columns worker and item (or task)")
        pairs = list(zip(pairs["worker"].tolist(), pairs[item].tolist(), strict=True))
    if isinstance(pairs, str | bytes | Mapping) or not isinstance(pairs, Iterable):
        raise ValueError(f"pairs: give a list of (worker, item) pairs, got {pairs!r}")
    out = []
    for n, p in enumerate(pairs):
        if isinstance(p, Mapping) and "worker" in p and "item" in p:
            worker, item = p["worker"], p["item"]
        elif isinstance(p, Sequence) and not isinstance(p, str | bytes) and len(p) == 2:
            worker, item = p
        else:
            raise ValueError(f"pair {n}: expected (worker, item) or a mapping with worker and "
                             f"item, got {p!r}")  # fmt: skip
        out.append({"worker": as_text(worker, f"pair {n}: worker"),
                    "item": as_text(item, f"pair {n}: item")})  # fmt: skip
    return out


def _gold_from_pandas(gold: Any) -> list[tuple[Any, Any]] | None:
    """crowd-kit's gold: a Series of true labels indexed by task (``gt``), or a DataFrame with
    ``task`` (or ``item``) and ``true_label`` (or ``label``) columns."""
    columns = getattr(gold, "columns", None)
    if columns is not None:
        cols = set(columns)
        item = "task" if "task" in cols else "item"
        label = "true_label" if "true_label" in cols else "label"
        if not {item, label} <= cols:
            raise ValueError(
                "a gold DataFrame needs the columns task (or item) and true_label (or label)"
            )
        return list(zip(gold[item].tolist(), gold[label].tolist(), strict=True))
    if hasattr(gold, "index") and hasattr(gold, "items") and hasattr(gold, "dtype"):
        return list(gold.items())  # a Series: task -> true label
    return None


def prepare_gold(
    gold: Iterable[Gold | Mapping[str, Any] | Sequence[Any]] | Any,
) -> list[dict[str, str]]:
    """Gold answers as JSON-ready dicts: ``Gold`` models, mappings, (item, label) pairs, a
    mapping item -> label, or crowd-kit's gold (a Series indexed by task, or a DataFrame)."""
    pairs = _gold_from_pandas(gold)
    if pairs is None and isinstance(gold, Mapping):
        pairs = list(gold.items())
    source: Iterable[Any] = pairs if pairs is not None else gold
    out = []
    for n, x in enumerate(source):
        if isinstance(x, Gold):
            out.append(x.model_dump())
        elif isinstance(x, Mapping):
            missing = [k for k in ("item", "label") if k not in x]
            if missing:
                raise ValueError(f"gold {n}: no {missing[0]!r}")
            item, label = x["item"], x["label"]
            out.append(
                {
                    "item": as_text(item, f"gold {n}: item"),
                    "label": as_text(label, f"gold {n}: label"),
                }
            )
        else:
            if isinstance(x, str) or not isinstance(x, Sequence) or len(x) != 2:
                raise ValueError(
                    f"gold {n}: expected Gold, a mapping or an (item, label) pair, got {x!r}"
                )
            out.append(
                {
                    "item": as_text(x[0], f"gold {n}: item"),
                    "label": as_text(x[1], f"gold {n}: label"),
                }
            )
    return out


def check_batch(batch_size: int) -> int:
    if not 1 <= batch_size <= MAX_BATCH:
        raise ValueError(f"batch_size must be within 1..{MAX_BATCH}, got {batch_size}")
    return batch_size


def retry_after(response: httpx.Response) -> float | None:
    """The answer's ``Retry-After`` in seconds (delta-seconds, or an HTTP date), at least 0;
    None when there is none or it cannot be read."""
    value = response.headers.get("retry-after", "").strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        when = parsedate_tz(value)
        if when is None:
            return None
        seconds = mktime_tz(when) - time.time()
    return max(seconds, 0.0) if math.isfinite(seconds) else None


@dataclass
class RetryPolicy:
    """Exponential back-off: ``backoff * 2**attempt`` seconds (jittered, capped at ``max_backoff``);
    an answer's ``Retry-After`` (a 429, a 503, a 507) is waited instead, capped at
    ``max_backoff``.

    Connection failures before the request went out and 507s (the store full: the service
    kept nothing of the request) are always retried, other transport errors and 5xx only for
    idempotent requests (GETs, DELETEs, label blocks whose labels all carry ids); ``retries``
    bounds them. A 429 is push-back, not a failure (the service's
    ``engine_behind`` appends nothing of the refused block): the same request is sent again
    after each wait, without spending the retries, for up to ``max_pushback`` seconds of
    waiting in all.
    """

    retries: int = 5
    backoff: float = 0.25
    max_backoff: float = 8.0
    max_pushback: float = 600.0

    def delay(self, attempt: int, response: httpx.Response | None) -> float:
        after = retry_after(response) if response is not None else None
        if after is not None:
            return min(after, self.max_backoff)
        d = min(self.backoff * 2.0 ** min(attempt, 64), self.max_backoff)
        return d / 2 + random.random() * d / 2

    def should_retry_status(self, status: int, attempt: int, idempotent: bool) -> bool:
        if attempt >= self.retries or status not in RETRY_STATUS or status == 429:
            return False
        return idempotent or status == KEPT_NOTHING

    def should_retry_exc(self, exc: httpx.TransportError, attempt: int, idempotent: bool) -> bool:
        if attempt >= self.retries:
            return False
        return idempotent or isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)


class Attempts:
    """The retries of one request under a ``RetryPolicy``: the clients send and sleep, this
    says how long to wait before sending again (and counts the attempts)."""

    def __init__(self, policy: RetryPolicy, method: str, url: str, idempotent: bool | None) -> None:
        self.policy, self.what, self.attempt = policy, f"{method} {url}", 0
        self.method = method
        self.pushed_back = 0.0  # seconds waited after 429s
        self.idempotent = (
            method in ("GET", "HEAD", "DELETE", "PUT") if idempotent is None else idempotent
        )

    def after_error(self, exc: httpx.TransportError) -> float:
        """Call in the ``except`` block: the wait, or ``TransportError`` when it is final."""
        if not self.policy.should_retry_exc(exc, self.attempt, self.idempotent):
            raise TransportError(f"{self.what}: {exc!r}") from exc
        return self._next(None)

    def after_answer(self, response: httpx.Response) -> float | None:
        """The wait, or None: ``response`` is the answer (``ApiError`` if it is an error)."""
        if response.status_code == 429 and self.pushed_back < self.policy.max_pushback:
            delay = max(self.policy.delay(min(self.attempt, 5), response), PUSHBACK_FLOOR)
            delay = min(delay, self.policy.max_pushback - self.pushed_back)  # (never past it)
            self.pushed_back += delay
            return delay
        if self.policy.should_retry_status(response.status_code, self.attempt, self.idempotent):
            return self._next(response)
        if self.method == "DELETE" and self.attempt > 0 and response.status_code == 404:
            return None  # (an earlier attempt, whose answer was lost, deleted it)
        raise_for(response)
        return None

    def _next(self, response: httpx.Response | None) -> float:
        delay = self.policy.delay(self.attempt, response)
        self.attempt += 1
        return delay


class Lines:
    """A stream's lines, split at newlines only (a carriage return before one dropped):
    httpx's ``iter_lines`` also splits at U+2028 and U+2029, which ids may hold."""

    def __init__(self) -> None:
        self.rest = b""

    def feed(self, chunk: bytes) -> list[str]:
        """The lines ``chunk`` completes."""
        *lines, self.rest = (self.rest + chunk).split(b"\n")
        return [line.removesuffix(b"\r").decode() for line in lines]

    def end(self) -> list[str]:
        """The last line, when the stream did not end with a newline."""
        return [self.rest.removesuffix(b"\r").decode()] if self.rest else []


def raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        body = response.json()["error"]
        raise ApiError(
            response.status_code,
            str(body.get("code", "error")),
            str(body.get("message", "")),
            body.get("entry"),
            body.get("field"),
        )
    except (ValueError, KeyError, TypeError):
        raise ApiError(response.status_code, "http_error", response.text[:500]) from None


def dumps(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()


COMPRESS_FROM = 4096
"""Bodies at least this long are sent gzipped by a client made with ``compress=True``."""


def body(data: Any, compress: bool) -> tuple[bytes | None, dict[str, str] | None]:
    """A request's body as sent, and the headers that say how: gzipped (level 1: a block of
    labels in a ninth of its bytes, a third with hashed ids) when ``compress`` and the JSON is
    long enough to gain from it."""
    if data is None:
        return None, None
    content = dumps(data)
    if not compress or len(content) < COMPRESS_FROM:
        return content, None
    return gzip.compress(content, compresslevel=1, mtime=0), {"Content-Encoding": "gzip"}


def headers(key: str | None, compress: bool = False) -> dict[str, str]:
    h = {"Content-Type": "application/json", "User-Agent": "crowdtally-client/0.1"}
    h["Accept-Encoding"] = "gzip" if compress else "identity"  # (gzip: see body)
    if key:
        h["Authorization"] = f"Bearer {key}"
    return h
