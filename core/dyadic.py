"""Dyadic rater-task model with importance-aware updates (docs/dyadic.md).

Predicts the label a rater gives a task from the two identifiers alone:
p = a_r·b_t + α_r + β_t + c per binary scorer (seed 000 parts I-III), with a_r, b_t in R^k in
hashed tables. Every example may carry an importance weight h; an update moves the parameters
along the exact gradient flow of weight h (closed forms for hinge and τ-quantile loss with L2
on the dyadic parameters, a one-dimensional ODE for squared and logistic loss). Multiclass
labels reduce to binary (one-against-all or the scoring filter tree); ordinal labels use
τ-quantile regression on the class code.

The numba kernels are in ``core/_dyadic_kernels.py``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields, replace
from functools import partial
from operator import methodcaller
from typing import Any

import numpy as np
import numpy.typing as npt

from core import _dyadic_kernels as _k

LOSSES: dict[str, int] = {
    "hinge": _k.HINGE,
    "logistic": _k.LOGISTIC,
    "squared": _k.SQUARED,
    "quantile": _k.QUANTILE,
}
REDUCTIONS = ("oaa", "tree")
_PERSON = b"crowdtally-d1"

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


def dyadic_id(name: str) -> int:
    """A stable signed 64-bit id of a rater or task name (BLAKE2b, as core/hashing.py)."""
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8, person=_PERSON).digest()
    return int.from_bytes(digest, "little", signed=True)


def dyadic_ids(names: Iterable[str]) -> I64:
    """Stable ids of many names (``dyadic_id`` of each); the model maps an id to slot ``id mod
    slots``. The digests are made and joined by maps, with no Python frame per name."""
    hashers = map(_hasher, map(str.encode, names))
    digests = b"".join(map(methodcaller("digest"), hashers))
    return np.frombuffer(digests, dtype="<i8").astype(np.int64)


_hasher = partial(hashlib.blake2b, digest_size=8, person=_PERSON)


def runner_up(scores: F64) -> I64:
    """The next-best label of each row of ``predict``'s scores (h_min's default target)."""
    return np.argsort(-scores, axis=1, kind="stable")[:, 1].astype(np.int64)


@dataclass(frozen=True)
class DyadicConfig:
    """Settings of a dyadic model; everything that changes learning is here.

    ``reduction`` matters only for ``n_classes > 2`` without ``ordinal`` ("oaa": one scorer
    per class trained against all; "tree": the scoring filter tree). Binary problems use one
    scorer (p > 0 means class 1); ordinal problems one τ-quantile regressor on the class code.
    ``l2`` is λ of part III (dyadic parameters only, applied along each update's flow).
    Learning rate: η_t = eta · (t0 / (t0 + t))^power, t the total importance weight seen;
    with ``adaptive`` per-coordinate AdaGrad rates η / sqrt(1 + Σ h g²) instead (seed 003).
    The dyadic parameters move at ``dyadic_rate`` · η: a rate tuned on the linear model
    leaves the factors barely moved at 1 (docs/dyadic.md, "Measurements").
    """

    n_classes: int = 2
    k: int = 1
    loss: str = "logistic"
    reduction: str = "oaa"
    rater_slots: int = 1 << 16
    task_slots: int = 1 << 18
    eta: float = 0.5
    t0: float = 1000.0
    power: float = 0.5
    adaptive: bool = False
    l2: float = 0.05
    tau: float = 0.5
    ordinal: bool = False
    init_scale: float = 0.1
    seed: int = 0
    ode_tol: float = 1e-10
    l2_linear: float = 0.0
    dyadic_rate: float = 3.0

    def __post_init__(self) -> None:
        if self.n_classes < 2:
            raise ValueError(f"n_classes must be at least 2, got {self.n_classes}")
        if self.k < 0:
            raise ValueError(f"k must be >= 0, got {self.k}")
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {sorted(LOSSES)}, got {self.loss!r}")
        if self.reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {self.reduction!r}")
        if self.rater_slots < 1 or self.task_slots < 1:
            raise ValueError("slot counts must be positive")
        if not (self.eta > 0 and self.t0 > 0 and self.power >= 0):
            raise ValueError("need eta > 0, t0 > 0, power >= 0")
        if not 0.0 < self.tau < 1.0:
            raise ValueError(f"tau must be in (0, 1), got {self.tau}")
        if not 0.0 <= self.l2 <= min(self.tau, 1.0 - self.tau, 1.0):
            # keeps each update's path monotone in h (docs/dyadic.md), so h_min is well defined
            raise ValueError(f"l2 must be in [0, min(tau, 1 - tau)], got {self.l2}")
        if self.l2_linear < 0.0 or (self.l2_linear > 0.0 and self.adaptive):
            # one decay rate per update needs one linear rate (docs/dyadic.md)
            raise ValueError(
                f"l2_linear must be >= 0 and needs adaptive=False, got {self.l2_linear}"
            )
        if not self.dyadic_rate > 0.0:
            raise ValueError(f"dyadic_rate must be positive, got {self.dyadic_rate}")
        if self.ordinal and self.loss not in ("quantile", "squared"):
            raise ValueError("ordinal labels need loss 'quantile' or 'squared'")
        if not self.ordinal and self.loss == "quantile":
            raise ValueError("loss 'quantile' is for ordinal labels (ordinal=True)")

    @property
    def reduction_code(self) -> int:
        if self.ordinal:
            return _k.ORDINAL
        if self.n_classes == 2:
            return _k.BINARY
        return _k.OAA if self.reduction == "oaa" else _k.TREE

    @property
    def n_scorers(self) -> int:
        return 1 if self.reduction_code in (_k.BINARY, _k.ORDINAL) else self.n_classes

    def hyper_vector(self) -> F64:
        h = np.zeros(11)
        h[_k.H_ETA] = self.eta
        h[_k.H_T0] = self.t0
        h[_k.H_POWER] = self.power
        h[_k.H_L2] = self.l2
        h[_k.H_TAU] = self.tau
        h[_k.H_ADAPTIVE] = 1.0 if self.adaptive else 0.0
        h[_k.H_LOSS] = LOSSES[self.loss]
        h[_k.H_K] = self.k
        h[_k.H_ODE_TOL] = self.ode_tol
        h[_k.H_L2_LIN] = self.l2_linear
        h[_k.H_DRATE] = self.dyadic_rate
        return h

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DyadicConfig:
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown DyadicConfig fields: {sorted(unknown)}")
        return cls(**d)


_ARRAY_NAMES = ("A", "B", "WR", "WT", "WC", "G", "GWR", "GWT", "GC", "GA", "GB")


class DyadicModel:
    """The dyadic model: hashed tables plus numba learning, prediction and h_min."""

    def __init__(self, config: DyadicConfig) -> None:
        self.config = config
        S, R, T = config.n_scorers, config.rater_slots, config.task_slots
        # change of variables (part II): ã = a + 1 starts at 1, with a small perturbation that
        # breaks the symmetry between the k latent coordinates (part II breaks it at the first
        # update; perturbing every slot up front is the same thing, and deterministic)
        self.A: F64 = initial_factors(config, RATER, np.arange(R, dtype=np.int64))
        self.B: F64 = initial_factors(config, TASK, np.arange(T, dtype=np.int64))
        self.WR: F64 = np.zeros((R, S))
        self.WT: F64 = np.zeros((T, S))
        self.WC: F64 = np.zeros(S)
        self.G: F64 = np.zeros(1)  # total importance weight seen (the rate schedule's t)
        ad = config.adaptive
        self.GWR: F64 = np.zeros((R, S) if ad else (0, S))
        self.GWT: F64 = np.zeros((T, S) if ad else (0, S))
        self.GC: F64 = np.zeros(S)
        self.GA: F64 = np.zeros((R, S) if ad else (0, S))
        self.GB: F64 = np.zeros((T, S) if ad else (0, S))
        self._hyper = config.hyper_vector()

    def _tables(self) -> tuple[F64, ...]:
        return (self.A, self.B, self.WR, self.WT, self.WC, self.G, self.GWR, self.GWT,
                self.GC, self.GA, self.GB)  # fmt: skip

    def learn_many(self, raters: I64, tasks: I64, labels: I64, weights: F64 | None = None) -> None:
        """Learn the examples in array order; labels are class codes 0..n_classes-1."""
        raters, tasks, labels = _i64(raters), _i64(tasks), _i64(labels)
        n = raters.shape[0]
        if tasks.shape[0] != n or labels.shape[0] != n:
            raise ValueError("raters, tasks and labels must have the same length")
        w = np.ones(n) if weights is None else np.ascontiguousarray(weights, dtype=np.float64)
        if w.shape[0] != n:
            raise ValueError("weights must have the same length as labels")
        if n and (labels.min() < 0 or labels.max() >= self.config.n_classes):
            raise ValueError("labels must be class codes in [0, n_classes)")
        if n and (not np.all(np.isfinite(w)) or w.min() < 0):
            raise ValueError("weights must be finite and non-negative")
        _k.learn_many(*self._tables(), self._hyper, self.config.reduction_code,
                      self.config.n_classes, raters, tasks, labels, w)  # fmt: skip

    def raw_scores(self, raters: I64, tasks: I64) -> F64:
        """The scorers' outputs, shape (n, n_scorers)."""
        raters, tasks = _pairs(raters, tasks)
        out = np.empty((raters.shape[0], self.config.n_scorers))
        _k.predict_many(self.A, self.B, self.WR, self.WT, self.WC, raters, tasks, out)
        return out

    def predict(self, raters: I64, tasks: I64) -> tuple[I64, F64]:
        """(labels, scores (n, n_classes)); the label is the argmax of the scores.

        Binary: scores (−p, p). Ordinal: p is the predicted code, scores −|p − c|, the label
        the nearest code. Multiclass: the per-class scorers (both reductions predict argmax:
        a scoring filter tree's winner is the best score in the tournament).
        """
        raw = self.raw_scores(raters, tasks)
        c = self.config
        if c.reduction_code == _k.BINARY:
            scores = np.concatenate([-raw, raw], axis=1)
        elif c.reduction_code == _k.ORDINAL:
            scores = -np.abs(raw - np.arange(c.n_classes, dtype=np.float64)[None, :])
        else:
            scores = raw
        return np.argmax(scores, axis=1).astype(np.int64), scores

    def h_min(self, raters: I64, tasks: I64, target: I64 | None = None) -> F64:
        """Smallest importance weight of a (rater, task, target) example making target predicted.

        ``target`` defaults to the next-best label; 0 where target is already predicted, inf
        where no weight reaches it. Binary / ordinal: part II's h_min at the decision boundary.
        """
        raters, tasks = _pairs(raters, tasks)
        if target is None:
            target = runner_up(self.predict(raters, tasks)[1])
        target = np.asarray(target, dtype=np.int64)  # (0-d: one code for every pair)
        if target.ndim != 0 and target.shape != raters.shape:
            raise ValueError("target must be one class code, or one per (rater, task) pair")
        target = np.ascontiguousarray(np.broadcast_to(target, raters.shape))
        if target.size and (target.min() < 0 or target.max() >= self.config.n_classes):
            raise ValueError("targets must be class codes in [0, n_classes)")
        out = np.empty(raters.shape[0])
        _k.h_min_many(*self._tables(), self._hyper, self.config.reduction_code,
                      self.config.n_classes, raters, tasks, target, out)  # fmt: skip
        return out

    def rows(self, table: str, slots: I64) -> F64:
        """The given slots' parameters in one table (RATER or TASK), one flat row per slot.

        A row is the slot's factors (n_scorers × k), its linear weights (n_scorers) and, with
        adaptive rates, its accumulators: all that a prediction or h_min reads of the slot.
        """
        slots = _i64(slots)
        parts = [
            a[slots].reshape(slots.size, int(np.prod(a.shape[1:]))) for a in self._row_tables(table)
        ]
        return np.ascontiguousarray(np.concatenate(parts, axis=1))

    def set_rows(self, table: str, slots: I64, rows: F64) -> None:
        """Overwrite the given slots (the inverse of ``rows``)."""
        slots = _i64(slots)
        at = 0
        for a in self._row_tables(table):
            width = int(np.prod(a.shape[1:]))
            a[slots] = rows[:, at : at + width].reshape((slots.size, *a.shape[1:]))
            at += width

    def _row_tables(self, table: str) -> list[F64]:
        tables = [getattr(self, name) for name in _ROWS[table]]
        return [a for a in tables if a.shape[0]]  # accumulators are empty without adaptive

    def shared(self) -> F64:
        """The parameters every prediction reads: the constant, its accumulator, and t."""
        return np.concatenate([self.WC, self.GC, self.G])

    def set_shared(self, shared: F64) -> None:
        S = self.config.n_scorers
        self.WC[:], self.GC[:], self.G[:] = shared[:S], shared[S : 2 * S], shared[2 * S :]

    @classmethod
    def from_rows(
        cls, config: DyadicConfig, shared: F64, rater_rows: F64, task_rows: F64
    ) -> DyadicModel:
        """A model over only the given rows: rater id i is ``rater_rows[i]``, task id j is
        ``task_rows[j]`` (the API predicts from the rows it read, without whole tables)."""
        small = replace(
            config, rater_slots=max(len(rater_rows), 1), task_slots=max(len(task_rows), 1)
        )
        model = cls(small)
        n_r, n_t = len(rater_rows), len(task_rows)
        model.set_rows(RATER, np.arange(n_r, dtype=np.int64), rater_rows)
        model.set_rows(TASK, np.arange(n_t, dtype=np.int64), task_rows)
        model.set_shared(shared)
        return model

    def with_room(self, rater_slots: int, task_slots: int) -> DyadicModel:
        """This model in tables of ``rater_slots`` and ``task_slots`` rows (no fewer than it
        has): its rows copied, the rows added zero, not initial rows (``initial_rows``): set
        them before they are read. Zeros cost nothing until written; building the initial rows
        of every slot of the larger tables first took 34 ms where this takes 23 (the engine's
        task tables at 172,000 items)."""
        config = replace(self.config, rater_slots=rater_slots, task_slots=task_slots)
        tables = {}
        for name, shape in _shapes(config).items():
            held = getattr(self, name)
            if held.shape[0] > shape[0]:
                raise ValueError(f"{name}: {held.shape[0]} rows held, room for {shape[0]}")
            tables[name] = np.zeros(shape)
            tables[name][: held.shape[0]] = held
        return DyadicModel._of(config, tables)

    def arrays(self) -> dict[str, F64]:
        """The whole learned state (copies); ``from_arrays`` restores it bit for bit."""
        return {name: getattr(self, name).copy() for name in _ARRAY_NAMES}

    @classmethod
    def from_arrays(cls, config: DyadicConfig, arrays: dict[str, np.ndarray]) -> DyadicModel:
        fresh_shapes = _shapes(config)
        tables = {}
        for name in _ARRAY_NAMES:
            a = np.ascontiguousarray(arrays[name], dtype=np.float64).copy()
            if a.shape != fresh_shapes[name]:
                raise ValueError(
                    f"array {name} has shape {a.shape}, config needs {fresh_shapes[name]}"
                )
            tables[name] = a
        return cls._of(config, tables)

    @classmethod
    def _of(cls, config: DyadicConfig, tables: dict[str, F64]) -> DyadicModel:
        """A model holding ``tables`` (one per name of ``_ARRAY_NAMES``, of the config's
        shapes) as they are."""
        model = cls.__new__(cls)
        model.config, model._hyper = config, config.hyper_vector()
        for name in _ARRAY_NAMES:
            setattr(model, name, tables[name])
        return model


RATER, TASK = "rater", "task"
_ROWS = {RATER: ("A", "WR", "GWR", "GA"), TASK: ("B", "WT", "GWT", "GB")}
_TABLE_CODE = {RATER: 1, TASK: 2}


def initial_factors(config: DyadicConfig, table: str, slots: I64) -> F64:
    """ã (or b̃) of never-updated slots: 1 + U(−init_scale, init_scale) per coordinate.

    Each value is a function of (seed, table, slot, scorer, coordinate) alone (splitmix64 of
    base + slot·S·k + coordinate, modulo 2^64), so any slot's initial row is known without
    building the table.
    """
    S, k = config.n_scorers, config.k
    where = _i64(slots)
    base = (config.seed * 0x9E3779B97F4A7C15 + _TABLE_CODE[table] * 0xD1B54A32D192ED03) % 2**64
    out: F64 = np.empty((where.size, S * k))
    _k.initial_factors(where, np.uint64(base), config.init_scale, out)
    return out.reshape(where.size, S, k)


def _shapes(c: DyadicConfig) -> dict[str, tuple[int, ...]]:
    S, R, T = c.n_scorers, c.rater_slots, c.task_slots
    ad = c.adaptive
    return {
        "A": (R, S, c.k), "B": (T, S, c.k), "WR": (R, S), "WT": (T, S), "WC": (S,), "G": (1,),
        "GWR": (R if ad else 0, S), "GWT": (T if ad else 0, S), "GC": (S,),
        "GA": (R if ad else 0, S), "GB": (T if ad else 0, S),
    }  # fmt: skip


def _i64(a: Any) -> I64:
    return np.ascontiguousarray(a, dtype=np.int64)


def _pairs(raters: Any, tasks: Any) -> tuple[I64, I64]:
    """(rater, task) pairs as int64 arrays of one length (the kernels read both by index)."""
    raters, tasks = _i64(raters), _i64(tasks)
    if raters.ndim != 1 or raters.shape != tasks.shape:
        raise ValueError("raters and tasks must be 1-d arrays of the same length")
    return raters, tasks


def initial_rows(config: DyadicConfig, table: str, slots: I64) -> F64:
    """``DyadicModel.rows`` of never-updated slots (initial factors, zero weights)."""
    shapes = _shapes(config)
    width = sum(int(np.prod(shapes[name][1:])) for name in _ROWS[table] if shapes[name][0])
    factors = initial_factors(config, table, _i64(slots)).reshape(
        len(slots), config.n_scorers * config.k
    )
    out = np.zeros((len(slots), width))
    out[:, : factors.shape[1]] = factors  # a row starts with the slot's factors
    return out
