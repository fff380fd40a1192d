"""A block of labels is validated into plain dicts (``bodies.entries_of``), not into a
``LabelIn`` per entry: the two must accept, refuse (with the same errors, in an order of
their own) and read the same entries."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from app.api.bodies import LABELS, WEIGHT
from app.api.schemas import LabelIn

MODELS = TypeAdapter(list[LabelIn])

texts = st.one_of(
    st.text(max_size=6),
    st.text(alphabet="ab\x00\n\x7f\x85é", min_size=1, max_size=3),
    st.just("x" * 513),
    st.just("x" * 512),
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
