"""core._vecmath: exp and log in plain arithmetic, against libm, one by one and vectorised."""

from __future__ import annotations

import math

import numba
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from core._vecmath import exp, exp_all, log, log_all, padded


@numba.njit(error_model="numpy")
def _exp_one(x: float) -> float:
    return exp(x)


@numba.njit(error_model="numpy")
def _log_one(x: float) -> float:
    return log(x)


@numba.njit(error_model="numpy")
def _exp_vector(x: np.ndarray) -> np.ndarray:
    out = np.empty(x.size)
    exp_all(x, out, x.size)
    return out


@numba.njit(error_model="numpy")
def _log_vector(x: np.ndarray) -> np.ndarray:
    out = np.empty(x.size)
    log_all(x, out, x.size)
    return out


def _ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return np.abs(got - want) / np.spacing(np.abs(want))


def test_exp_is_within_one_ulp_of_libm_from_minus_708_to_709() -> None:
    rng = np.random.default_rng(0)
    x = np.concatenate([
        -rng.exponential(5.0, 200_000), rng.uniform(-708.0, 709.0, 200_000),
        rng.uniform(-1e-3, 1e-3, 10_000), [-708.0, 0.0, -0.0, 709.0],
    ])  # fmt: skip
    got = _exp_vector(padded_copy(x))[: x.size]
    assert _ulps(got, np.exp(x)).max() <= 1.0
    assert got[-3] == 1.0 and got[-2] == 1.0  # exp(0) exactly: a softmax row's largest term


def test_log_is_within_two_ulp_of_libm_for_positive_doubles() -> None:
    rng = np.random.default_rng(1)
    x = np.concatenate([
        rng.uniform(1.0, 12.0, 200_000), rng.uniform(0.0, 1.0, 100_000),
        np.exp(rng.uniform(-700.0, 700.0, 100_000)), rng.uniform(5e-324, 2.2e-308, 10_000),
        rng.uniform(1 - 1e-6, 1 + 1e-6, 10_000), [np.sqrt(2.0), 2.0, 1e308],
    ])  # fmt: skip
    got = _log_vector(padded_copy(x, fill=1.0))[: x.size]
    want = np.log(x)
    exact = want == 0.0
    assert np.all(got[exact] == 0.0)
    assert _ulps(got[~exact], want[~exact]).max() <= 2.0


def test_special_values_follow_libm() -> None:
    assert math.isnan(_exp_one(math.nan))
    assert _exp_one(-math.inf) == 0.0 and _exp_one(-745.0) == 0.0
    assert _exp_one(math.inf) == math.inf and _exp_one(710.0) == math.inf
    assert _log_one(0.0) == -math.inf
    assert _log_one(math.inf) == math.inf
    assert math.isnan(_log_one(-1.0)) and math.isnan(_log_one(math.nan))
    assert _log_one(1.0) == 0.0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-800.0, 800.0), min_size=1, max_size=40))
def test_a_vectorised_loop_gives_each_value_s_own_result(values: list[float]) -> None:
    """The same bits whether a value is computed in a vector lane or alone: replays do not
    depend on how the loop around it was compiled."""
    x = np.array(values)
    alone = np.array([_exp_one(v) for v in values])
    assert _exp_vector(padded_copy(x))[: x.size].tobytes() == alone.tobytes()
    positive = np.abs(x) + 1e-300
    alone_log = np.array([_log_one(v) for v in positive])
    got = _log_vector(padded_copy(positive, fill=1.0))[: x.size]
    assert got.tobytes() == alone_log.tobytes()


def padded_copy(x: np.ndarray, fill: float = 0.0) -> np.ndarray:
    """``x`` with ``fill`` up to a whole number of vectors (``padded``)."""
    out = np.full(padded(x.size), fill)
    out[: x.size] = x
    return out
