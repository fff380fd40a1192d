"""A block of labels is validated into plain dicts (``bodies.entries_of``), not into a
``LabelIn`` per entry: the two must accept, refuse (with the same errors, in an order of
their own) and read the same entries. A block whose text has no escape is read by msgspec
first (``bodies.fast_labels``): it must accept exactly the blocks pydantic accepts, and read
them alike."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from app.api import bodies
from app.api.bodies import LABELS, WEIGHT, fast_labels, label_block
from app.api.errors import ApiError
from app.api.schemas import LabelIn

MODELS = TypeAdapter(list[LabelIn])

texts = st.one_of(
    st.text(max_size=6),
    st.text(alphabet="ab\x00\n\x7f\x85é", min_size=1, max_size=3),
    st.sampled_from(["x" * 513, "x" * 512, "y" * 129, "y" * 128, "\U0001f600" * 128, "£"]),
)
values = st.one_of(
    texts,
    st.none(),
    st.booleans(),
    st.integers(-3, 2_000_000),
    st.floats(allow_nan=False, allow_infinity=False),
)
entries = st.dictionaries(
    st.sampled_from(["item", "worker", "label", "id", "weight", "extra"]), values, max_size=6
)
valid = st.fixed_dictionaries(
    {"item": texts, "worker": texts, "label": texts},
    optional={"id": st.one_of(texts, st.none()), "weight": st.floats(0, 1e6)},
)


def outcome(adapter: TypeAdapter[Any], block: list[dict[str, Any]]) -> Any:
    try:
        return adapter.validate_json(orjson.dumps(block))
    except ValidationError as exc:
        return sorted((e["type"], e["loc"]) for e in exc.errors())


def as_dicts(models: Any) -> Any:
    return [m.model_dump() for m in models] if isinstance(models[0], LabelIn) else models


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(entries, valid), min_size=1, max_size=4))
def test_dicts_and_models_accept_refuse_and_read_the_same_entries(
    block: list[dict[str, Any]],
) -> None:
    by_model, by_dict = outcome(MODELS, block), outcome(LABELS, block)
    if isinstance(by_dict, list) and by_dict and isinstance(by_dict[0], tuple):
        assert by_model == by_dict
        return
    filled = [{"id": None, "weight": WEIGHT, **entry} for entry in by_dict]
    assert as_dicts(by_model) == filled


LIMIT = 3


def columns_or_error(raw: bytes) -> Any:
    try:
        return label_block(raw, LIMIT, 10.0)
    except ApiError as exc:
        return exc.status, exc.code, exc.message, exc.entry, exc.field


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(entries, valid), max_size=4), st.booleans())
def test_the_fast_reading_accepts_what_pydantic_accepts_and_reads_it_alike(
    block: list[dict[str, Any]], spaced: bool
) -> None:
    raw = orjson.dumps(block, option=orjson.OPT_INDENT_2 if spaced else 0)
    fast = fast_labels(raw, LIMIT)
    by_dict = outcome(LABELS, block)
    accepted = not (by_dict and isinstance(by_dict[0], tuple)) and 0 < len(block) <= LIMIT
    if fast is None:  # refused, or text with an escape, DEL or a C1 lead byte: pydantic reads it
        assert not accepted or any(m in raw for m in (b"\\", b"\x7f", b"\xc2"))
        return
    assert accepted
    filled = [{"id": None, "weight": WEIGHT, **entry} for entry in by_dict]
    assert [{f: getattr(x, f) for f in x.__struct_fields__} for x in fast] == filled


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(entries, valid), max_size=4))
def test_a_block_reads_to_the_same_columns_or_error_either_way(
    block: list[dict[str, Any]],
) -> None:
    raw = orjson.dumps(block)
    either = columns_or_error(raw)
    original = bodies.fast_labels
    bodies.fast_labels = lambda raw, limit: None  # type: ignore[assignment]
    try:
        assert columns_or_error(raw) == either
    finally:
        bodies.fast_labels = original
