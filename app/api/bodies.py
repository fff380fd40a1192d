"""Bodies read by hand: JSON arrays of labels, gold answers, items or pairs, validated whole.

A block is parsed in one pass when it is valid; when it is not, the first bad entry and
field are named in the error. ``array_body`` gives such a route its OpenAPI request body and
``add_body_schemas`` the schemas it refers to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, NotRequired

import msgspec
import orjson
from pydantic import BaseModel, TypeAdapter, ValidationError
from typing_extensions import TypedDict

from app.api.errors import NOT_AN_OBJECT, ApiError, json_type, not_utf8
from app.api.schemas import (
    MAX_LABEL_LENGTH,
    NO_CONTROL_MESSAGE,
    GoldIn,
    ItemIn,
    LabelIn,
    PairIn,
)
from app.io.input import MAX_ID_LENGTH
from app.store.base import ProjectRecord


def entries_of(model: type[BaseModel]) -> Any:
    """A TypedDict with ``model``'s fields, constraints and config: a block validated into
    plain dicts skips building a model instance per entry (half of a label block's
    validation). Fields with a default may be absent: read them with ``.get``."""
    fields = {}
    for name, info in model.model_fields.items():
        kind = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
        fields[name] = kind if info.is_required() else NotRequired[kind]
    entry = TypedDict(model.__name__, fields)  # type: ignore[misc]
    entry.__pydantic_config__ = model.model_config  # type: ignore[attr-defined]
    return entry


LABELS: TypeAdapter[list[dict[str, Any]]] = TypeAdapter(list[entries_of(LabelIn)])  # type: ignore[misc]
WEIGHT = LabelIn.model_fields["weight"].default
GOLD = TypeAdapter(list[GoldIn])
ITEMS = TypeAdapter(list[ItemIn])
PAIRS = TypeAdapter(list[PairIn])
MAX_ENTRY_BYTES = 2048
"""A body may hold this many bytes for each entry it may hold (413 above)."""
BODIES: dict[str, type[BaseModel]] = {m.__name__: m for m in (LabelIn, GoldIn, ItemIn, PairIn)}
"""The entries of the bodies read by hand, by their schema's name."""


@dataclass(frozen=True)
class LabelColumns:
    """A block of labels, validated, as columns."""

    items: list[str]
    workers: list[str]
    labels: list[str]
    weights: list[float] | None
    """None when every label weighs 1 (the default)."""
    ids: list[str | None]


_FastId = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID_LENGTH)]


class _FastLabel(msgspec.Struct, forbid_unknown_fields=True):
    """``LabelIn`` for msgspec: its fields, types and bounds but the control-character pattern,
    which ``fast_labels`` checks on the body's bytes instead (a property test holds the two to
    the same verdicts)."""

    item: _FastId
    worker: _FastId
    label: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_LABEL_LENGTH)]
    id: _FastId | None = None
    weight: Annotated[float, msgspec.Meta(ge=0)] = WEIGHT


_FAST_LABELS = msgspec.json.Decoder(list[_FastLabel])
_ESCAPES_AND_C1 = (b"\\", b"\x7f", b"\xc2")
"""What JSON text needs for a string to hold a control character (``schemas.NO_CONTROL``):
an escape (C0 characters may not appear raw), DEL, or UTF-8's lead byte of U+0080-U+009F."""


def fast_labels(raw: bytes, limit: int) -> list[_FastLabel] | None:
    """A valid block of at most ``limit`` labels whose text holds none of ``_ESCAPES_AND_C1``
    (what clients send), decoded and validated in one pass by msgspec, 3.5x faster than
    pydantic (docs/benchmarks.md); None for anything else, which ``parse_block`` reads and
    explains."""
    if len(raw) > limit * MAX_ENTRY_BYTES or any(mark in raw for mark in _ESCAPES_AND_C1):
        return None
    try:
        out = _FAST_LABELS.decode(raw)
    except msgspec.MsgspecError:
        return None
    return out if 0 < len(out) <= limit else None


def label_block(raw: bytes, limit: int, max_weight: float) -> LabelColumns:
    """A block of labels (``LabelIn``), validated; a ``weight`` above ``max_weight`` is
    refused too (422 naming the entry and field ``weight``)."""
    fast = fast_labels(raw, limit)
    if fast is not None:
        items, workers = [x.item for x in fast], [x.worker for x in fast]
        labels, ids = [x.label for x in fast], [x.id for x in fast]
        weights = [x.weight for x in fast]
    else:
        out = parse_block(raw, LABELS, limit)
        items, workers = [x["item"] for x in out], [x["worker"] for x in out]
        labels, ids = [x["label"] for x in out], [x.get("id") for x in out]
        weights = [x.get("weight", WEIGHT) for x in out]
    heaviest = max(weights)
    if heaviest > max_weight:
        entry = next(n for n, w in enumerate(weights) if w > max_weight)
        raise ApiError(
            422,
            "invalid_label",
            f"entry {entry}, field 'weight': {weights[entry]!r} is above the largest weight "
            f"one label may carry, {max_weight!r} (CROWDTALLY_MAX_LABEL_WEIGHT)",
            entry,
            "weight",
        )
    same = heaviest == min(weights) == 1.0
    block = LabelColumns(items, workers, labels, None if same else weights, ids)
    refuse_ids_given_twice(block, weights)
    return block


def refuse_ids_given_twice(block: LabelColumns, weights: list[float]) -> None:
    """422 for a label whose id an earlier, different label of the block has: an id names
    one label, and the second would be dropped as a repeat of the first. (The same label
    twice is a repeat.)"""
    named = [i for i in block.ids if i is not None]
    if len(set(named)) == len(named):
        return
    first: dict[str, int] = {}
    for n, i in enumerate(block.ids):
        if i is None:
            continue
        m = first.setdefault(i, n)
        label = (block.items[n], block.workers[n], block.labels[n], weights[n])
        if m != n and label != (block.items[m], block.workers[m], block.labels[m], weights[m]):
            raise ApiError(
                422,
                "invalid_label",
                f"entry {n}, field 'id': {i!r} is the id of another label in this block (entry "
                f"{m}): an id names one label",
                n,
                "id",
            )


def parse_block(
    raw: bytes, adapter: TypeAdapter[Any], limit: int, what: str = "label", code: str = ""
) -> list[Any]:
    """The block's entries, validated (422 naming the first bad entry and field); ``what``
    names an entry in the messages, ``code`` a bad entry's error (``invalid_<what>``)."""
    if len(raw) > limit * MAX_ENTRY_BYTES:
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
        try:
            raw.decode()
        except UnicodeDecodeError as not_text:
            raise not_utf8(not_text) from None
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
        msg = err["msg"]
        if err["type"] == "string_pattern_mismatch":  # ids: schemas.NO_CONTROL
            msg = NO_CONTROL_MESSAGE
        elif err["type"] in NOT_AN_OBJECT and field is None:
            msg = not_an_object(adapter, what, err["input"])
        elif err["type"] in WRONG_TYPE and field is not None:
            msg += f", not {json_type(err['input'])}"
            if err["input"] is None and loc[1:] and _has_default(adapter, str(loc[1])):
                msg += ": leave the field out for its default"
        n_bad = exc.error_count()
        more = f" ({n_bad - 1} more errors)" if n_bad > 1 else ""
        raise ApiError(
            422,
            code or f"invalid_{what}",
            f"entry {entry}, field {field!r}: {msg}{more}"
            if field is not None
            else f"entry {entry}: {msg}{more}",
            entry,
            field,
        ) from None
    return out


WRONG_TYPE = ("string_type", "float_type", "float_parsing", "int_type", "bool_type")
"""Pydantic's errors for a field of the wrong JSON type, whose messages do not say what was
sent ("Input should be a valid number")."""


def _entry_schema(adapter: TypeAdapter[Any]) -> dict[str, Any]:
    """The JSON schema of one entry of a block's ``adapter``."""
    entry: dict[str, Any] = next(iter(adapter.json_schema()["$defs"].values()))
    return entry


def _has_default(adapter: TypeAdapter[Any], field: str) -> bool:
    entry = _entry_schema(adapter)
    return field in entry["properties"] and field not in entry.get("required", ())


def not_an_object(adapter: TypeAdapter[Any], what: str, value: Any) -> str:
    """What an entry must look like, said for one that is no JSON object (pydantic's message
    names a class of ours: "a valid dictionary or instance of ItemIn")."""
    entry = _entry_schema(adapter)
    required = [f'"{k}"' for k in entry["required"]]
    optional = [f'"{k}"' for k in entry["properties"] if k not in entry["required"]]
    fields = ", ".join(required[:-1]) + " and " + required[-1] if required[1:] else required[0]
    if optional:
        fields += f" (and optionally {', '.join(optional)})"
    article = "an" if what[0] in "aeiou" else "a"
    return f"{article} {what} must be a JSON object with {fields}, not {json_type(value)}"


def array_body(schema: str) -> dict[str, Any]:
    """OpenAPI for a body read by hand (``parse_block``): a JSON array of ``schema``, one of
    ``BODIES``."""
    if schema not in BODIES:
        raise KeyError(f"{schema} is not one of {sorted(BODIES)}")
    items = {"$ref": f"#/components/schemas/{schema}"}
    content = {"application/json": {"schema": {"type": "array", "items": items}}}
    return {"requestBody": {"required": True, "content": content}}


def add_body_schemas(document: dict[str, Any]) -> None:
    """Put the schemas ``array_body`` refers to in the OpenAPI document's components (FastAPI
    lists only the models routes declare, and these bodies are read by hand)."""
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for name, model in BODIES.items():
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for sub, body in schema.pop("$defs", {}).items():
            schemas.setdefault(sub, body)
        schemas.setdefault(name, schema)


def label_codes(record: ProjectRecord, names: list[str]) -> list[int]:
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
