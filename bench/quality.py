"""Calibration and accuracy of the posteriors: ``python -m bench.quality``.

Per crowd (every shared dataset and the synthetic regimes of ``bench.crowds``): accuracy, ECE
(top-label confidence, 10 equal-width bins, points), mean NLL of the gold label and the Brier
score, for crowdtally online (one pass in a random item order; mean ± sd over ``--orders``
orders) and batch EM, and, in the same run, majority vote (vote shares) and crowd-kit 1.4.2's
DawidSkene, OneCoinDawidSkene, GLAD, MACE, Wawa and ZeroBasedSkill (``probas_``). Synthetic
crowds also get the oracle (the exact posterior under the true parameters). Then summaries over
the shared datasets and over synthetic crowds, and PASS/FAIL lines for the quality targets.

``--gold-fraction 0.05 --gold-max 50``: per crowd, that many items with truth are handed to
the crowdtally methods as known gold (honeypots); every method is scored on the other items.
A few dozen gold items score very differently from one draw to the next: ``--gold-draws 3``
repeats every method on 3 random gold sets and reports the mean and spread over all runs.

crowd-kit posteriors are cached in ``.bench-cache/quality/`` (keyed by the answers and the
crowd-kit version) and fitted in ``--jobs`` worker processes while crowdtally runs.

To benchmark a model variant, register it (one line), e.g.::

    register("online-d", lambda c, g, s: run_online(c, g, s, nominal_config(c, difficulty=True)),
             seeded=True)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import sys
import time
import warnings
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from app.settings import Settings
from bench.crowds import SYNTHETIC, Crowd, load_shared, synthetic
from bench.datasets import DEFAULT_ROOT, dataset_names
from core.blocks import LabelBlocks
from core.hashing import worker_slots
from core.nominal import NominalConfig
from core.online import OnlineEM
from core.pooling import fit_pooled
from core.served import (
    batch_calibration,
    held_out_corrections,
    online_calibration,
    served_posteriors,
)

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

N_BINS = 10
CACHE_DIR = Path(__file__).resolve().parent.parent / ".bench-cache" / "quality"

# ---------------------------------------------------------------------------------------
# Metrics: pure functions of posteriors (n, K) and gold (n,); items with gold < 0 skipped.


def _scored(posteriors: F64, gold: I64) -> tuple[F64, I64]:
    p = np.asarray(posteriors, dtype=np.float64)
    g = np.asarray(gold, dtype=np.int64)
    if p.ndim != 2 or g.shape != (p.shape[0],):
        raise ValueError(f"posteriors {p.shape} and gold {g.shape} do not match")
    keep = g >= 0
    return p[keep], g[keep]


def accuracy(posteriors: F64, gold: I64) -> float:
    """Fraction of gold items whose most probable class (lowest code on ties) is the gold one."""
    p, g = _scored(posteriors, gold)
    return float(np.mean(p.argmax(axis=1) == g)) if g.size else float("nan")


@dataclass(frozen=True)
class Bins:
    """Reliability bins of the top-label confidence: per bin the item count, the sum of the
    confidences and the number of correct top labels (sums, so bins pool by addition)."""

    count: F64
    confidence: F64
    correct: F64

    def __add__(self, other: Bins) -> Bins:
        return Bins(
            self.count + other.count,
            self.confidence + other.confidence,
            self.correct + other.correct,
        )

    def mean_confidence(self) -> F64:
        out: F64 = self.confidence / np.maximum(self.count, 1)
        return out

    def observed_accuracy(self) -> F64:
        out: F64 = self.correct / np.maximum(self.count, 1)
        return out

    def ece(self) -> float:
        """100 * sum_b (n_b / n) |acc_b - conf_b|."""
        n = self.count.sum()
        if n == 0:
            return float("nan")
        return float(100.0 * np.sum(np.abs(self.correct - self.confidence)) / n)


def reliability(posteriors: F64, gold: I64, n_bins: int = N_BINS) -> Bins:
    """Bin the gold items by top-label confidence into ``n_bins`` equal-width bins of [0, 1]
    (confidence 1 goes to the last bin)."""
    p, g = _scored(posteriors, gold)
    conf = p.max(axis=1)
    correct = (p.argmax(axis=1) == g).astype(np.float64)
    b = np.minimum((conf * n_bins).astype(np.int64), n_bins - 1)
    return Bins(
        np.bincount(b, minlength=n_bins).astype(np.float64),
        np.bincount(b, weights=conf, minlength=n_bins).astype(np.float64),
        np.bincount(b, weights=correct, minlength=n_bins).astype(np.float64),
    )


def ece(posteriors: F64, gold: I64, n_bins: int = N_BINS) -> float:
    """Expected calibration error in points (top-label, ``n_bins`` equal-width bins)."""
    return reliability(posteriors, gold, n_bins).ece()


def nll(posteriors: F64, gold: I64) -> float:
    """Mean negative log-probability of the gold class (probabilities clipped at 1e-12)."""
    p, g = _scored(posteriors, gold)
    if not g.size:
        return float("nan")
    return float(-np.mean(np.log(np.clip(p[np.arange(g.size), g], 1e-12, None))))


def brier(posteriors: F64, gold: I64) -> float:
    """Mean over gold items of sum_k (p_k - 1[k = gold])^2."""
    p, g = _scored(posteriors, gold)
    if not g.size:
        return float("nan")
    onehot = np.zeros_like(p)
    onehot[np.arange(g.size), g] = 1.0
    return float(np.mean(np.sum((p - onehot) ** 2, axis=1)))


METRICS = ("acc", "ece", "nll", "brier")


def scores(posteriors: F64, gold: I64) -> dict[str, float]:
    """All four metrics (accuracy in percent, ECE in points)."""
    return {
        "acc": 100.0 * accuracy(posteriors, gold),
        "ece": ece(posteriors, gold),
        "nll": nll(posteriors, gold),
        "brier": brier(posteriors, gold),
    }


IDLE_REFINE_PASSES: int = Settings.model_fields["refine_passes"].default
"""The refinement sweeps the service's engine runs over a project once it is idle."""

# ---------------------------------------------------------------------------------------
# crowdtally building blocks (small, so that variants are one-line registry entries)


def nominal_config(crowd: Crowd, **changes: Any) -> NominalConfig:
    """The service's default configuration for this crowd, with ``changes`` applied."""
    return NominalConfig(n_classes=crowd.n_classes, n_items=float(crowd.n_items), **changes)


def hashed_blocks(crowd: Crowd, config: NominalConfig) -> LabelBlocks:
    """One block per item, worker ids hashed into the config's slots (the online input)."""
    slots = worker_slots(crowd.worker_ids(), config.n_worker_slots)
    return LabelBlocks.group(crowd.item, slots[crowd.worker], crowd.label, n_blocks=crowd.n_items)


def exact_blocks(crowd: Crowd) -> LabelBlocks:
    """One block per item with exact worker codes (batch EM's input)."""
    return LabelBlocks.group(crowd.item, crowd.worker, crowd.label, n_blocks=crowd.n_items)


POOLED_ONLINE = partial(OnlineEM, pooled_twin=True)
"""The online model as ``crowdtally extract`` and the service start it: with its pooled twin
(eq. 29)."""


def run_online(
    crowd: Crowd,
    gold: I64,
    seed: int,
    config: NominalConfig | None = None,
    model: Callable[[NominalConfig], OnlineEM] = POOLED_ONLINE,
    served: bool = True,
    idle_passes: int = 0,
) -> F64:
    """One online pass over the items in a random order (``seed``), then ``idle_passes``
    revisit passes (what the service's engine runs once a project is idle: its refinement
    sweeps, docs/model.md eq. 14-16), then the posteriors of every item under the final
    parameters, as the service serves them (calibrated, docs/model.md eq. 21-25), or the
    model's own with ``served=False``; ``gold`` (-1 = unknown) is passed as ``known``."""
    config = config or nominal_config(crowd)
    blocks = hashed_blocks(crowd, config)
    em = model(config)
    order = np.random.default_rng(seed).permutation(blocks.n_blocks)
    result = em.learn_many(blocks, order=order, known=gold)
    anchored = bool(np.any(gold >= 0))
    if (perm := em.orient(anchored)) is not None:  # as extract does
        result.posteriors[:] = result.posteriors[:, perm]
    twin = em.twin_out
    if not idle_passes and (kept := em.settle()) is not None:  # the pooled twin's (eq. 29)
        result = kept
    elif idle_passes and em.lead():  # a sweep's start: the model in the lead is served
        assert twin is not None  # (a model with no twin never lets it lead)
        result, twin = twin, result
    for _ in range(idle_passes):  # in arrival order, as the engine's sweeps go
        result = em.revisit_many(
            blocks, result, order=order, out=result, known=gold, twin_previous=twin
        )
        twin = em.twin_out
    out: F64 = em.predict_many(blocks, known=gold).posteriors
    if served:  # a refined model is fitted to the items: each scored without its pull (eq. 26)
        lam = em.config.worker_prior
        prior = em.config.population_precision()
        held_out = (
            held_out_corrections(em.params, blocks, out, lam, population_precision=prior)
            if idle_passes
            else None
        )
        cal = online_calibration(em, blocks, gold, held_out)
        return served_posteriors(em.params, blocks, cal, gold, held_out)
    return out


def run_batch(
    crowd: Crowd, gold: I64, config: NominalConfig | None = None, served: bool = True
) -> F64:
    """Batch EM to its fixed point with exact worker ids, at the worker prior the answers
    choose (docs/model.md eq. 28); ``gold`` passed as ``known``; calibrated as served unless
    ``served=False``."""
    config = config or nominal_config(crowd)
    blocks = exact_blocks(crowd)
    fit = fit_pooled(config, blocks, crowd.n_workers, known=gold)  # lambda_A by eq. 28
    if served:  # at EM's fixed point: eq. 26, and eq. 27's Laplace rows
        params, held_out = fit.params, fit.held_out  # (the evidence at the prior chosen)
        cal = batch_calibration(fit.config, params, blocks, crowd.n_workers, gold, held_out)
        return served_posteriors(params, blocks, cal, gold, held_out)
    out: F64 = fit.result.probas
    return out


def vote_shares(crowd: Crowd) -> F64:
    """Majority vote as a posterior: each class's share of the item's votes (ties are equal
    shares; an item without answers is uniform)."""
    counts = np.zeros((crowd.n_items, crowd.n_classes))
    np.add.at(counts, (crowd.item, crowd.label), 1.0)
    totals = counts.sum(axis=1, keepdims=True)
    out: F64 = np.where(totals > 0, counts / np.maximum(totals, 1.0), 1.0 / crowd.n_classes)
    return out


# ---------------------------------------------------------------------------------------
# crowd-kit peers (posteriors cached on disk)

CROWDKIT = ("DawidSkene", "OneCoinDawidSkene", "GLAD", "MACE", "Wawa", "ZeroBasedSkill")


def _crowdkit_model(method: str) -> Any:
    from crowdkit import aggregation as agg

    if method == "MACE":
        return agg.MACE(random_state=0, verbose=0)
    if method == "GLAD":
        return agg.GLAD(silent=True)
    if method not in CROWDKIT:
        raise ValueError(f"unknown crowd-kit method {method!r}")
    return getattr(agg, method)()


def crowdkit_posteriors(method: str, crowd: Crowd) -> F64:
    """Fit crowd-kit's ``method`` (default hyperparameters) and return its ``probas_`` as an
    (n_items, K) array in class-code order; an item it gives no probas for is uniform."""
    model = _crowdkit_model(method)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        probas = model.fit_predict_proba(crowd.frame())
    K = crowd.n_classes
    table = probas.reindex(index=np.arange(crowd.n_items), columns=np.arange(K))
    p = np.nan_to_num(table.to_numpy(dtype=np.float64), nan=0.0)
    total = p.sum(axis=1, keepdims=True)
    out: F64 = np.where(total > 0, p / np.where(total > 0, total, 1.0), 1.0 / K)
    return out


def _crowdkit_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("crowd-kit")
    except PackageNotFoundError:
        return "unknown"


def cache_path(crowd: Crowd, method: str) -> Path:
    """``.bench-cache/quality/<crowd>-<method>-<hash of the answers and crowd-kit version>.npy``."""
    h = hashlib.sha1()
    for a in (crowd.item, crowd.worker, crowd.label):
        h.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
    h.update(f"{crowd.n_items},{crowd.n_classes},{method},{_crowdkit_version()}".encode())
    return CACHE_DIR / f"{crowd.name}-{method}-{h.hexdigest()[:16]}.npy"


def cached_crowdkit(method: str, crowd: Crowd) -> F64:
    """``crowdkit_posteriors`` through the disk cache."""
    path = cache_path(crowd, method)
    if path.exists():
        out: F64 = np.load(path)
        return out
    out = crowdkit_posteriors(method, crowd)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{time.monotonic_ns()}.tmp.npy")
    np.save(tmp, out)
    tmp.replace(path)
    return out


def _peer_job(method: str, crowd: Crowd) -> tuple[F64, float]:
    t0 = time.perf_counter()
    _log(f"  [peer] {crowd.name} {method} ...")
    out = cached_crowdkit(method, crowd)
    sec = time.perf_counter() - t0
    _log(f"  [peer] {crowd.name} {method} done in {sec:.1f}s")
    return out, sec


# ---------------------------------------------------------------------------------------
# The registry

Fit = Callable[[Crowd, I64, int], F64]
"""(crowd, gold given: class code per item or -1, seed) -> posteriors (n_items, K)."""
Kind = Literal["crowdtally", "reference", "baseline", "crowdkit"]


@dataclass(frozen=True)
class Method:
    name: str
    fit: Fit
    seeded: bool = False
    """Run once per order (seeds 0..orders-1), reported as mean ± sd; else once (seed 0)."""
    kind: Kind = "crowdtally"
    """crowdtally methods get the gold and are checked against the targets; baselines and
    crowd-kit ignore it; crowd-kit fits are cached and run in worker processes."""


METHODS: dict[str, Method] = {}


def register(name: str, fit: Fit, *, seeded: bool = False, kind: Kind = "crowdtally") -> Method:
    """Add (or replace) a method: ``register("online", lambda c, g, s: run_online(c, g, s),
    seeded=True)``."""
    METHODS[name] = Method(name, fit, seeded, kind)
    return METHODS[name]


def _crowdkit_fit(method: str) -> Fit:
    return lambda crowd, gold, seed: cached_crowdkit(method, crowd)


register("online", lambda c, g, s: run_online(c, g, s), seeded=True)
# what the service serves once a project has been idle a second: its refinement sweeps done
register(
    "online-idle",
    lambda c, g, s: run_online(c, g, s, idle_passes=IDLE_REFINE_PASSES),
    seeded=True,
)
register("batch", lambda c, g, s: run_batch(c, g))
# the model's own posteriors, before calibration: shown beside the served ones, not checked
register(
    "online-raw", lambda c, g, s: run_online(c, g, s, served=False), seeded=True, kind="reference"
)
register("batch-raw", lambda c, g, s: run_batch(c, g, served=False), kind="reference")
register("MV", lambda c, g, s: vote_shares(c), kind="baseline")
for _m in CROWDKIT:
    register(_m, _crowdkit_fit(_m), kind="crowdkit")

# ---------------------------------------------------------------------------------------
# Running


@dataclass
class Outcome:
    """One method on one crowd: metrics per seed, pooled reliability bins, fit seconds."""

    runs: list[dict[str, float]] = field(default_factory=list)
    bins: Bins | None = None
    seconds: float = 0.0

    def mean(self, metric: str) -> float:
        return float(np.mean([r[metric] for r in self.runs]))

    def sd(self, metric: str) -> float:
        return float(np.std([r[metric] for r in self.runs]))

    def add(self, posteriors: F64, target: I64) -> None:
        self.runs.append(scores(posteriors, target))
        b = reliability(posteriors, target)
        self.bins = b if self.bins is None else self.bins + b


@dataclass
class CrowdResult:
    crowd: Crowd
    given: I64
    """Gold handed to the crowdtally methods (-1 = not given)."""
    target: I64
    """Gold the methods are scored on (-1 = not scored)."""
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    draws: list[tuple[I64, I64]] = field(default_factory=list)
    """(given, target) of every gold draw; ``given`` and ``target`` are the first."""


def choose_gold(crowd: Crowd, fraction: float, at_most: int, seed: int = 0) -> I64:
    """Known gold for ``round(fraction * n_items)`` items (at most ``at_most``) picked at random
    (seeded by ``seed`` and the crowd's name) among those with truth; -1 elsewhere."""
    given = np.full(crowd.n_items, -1, dtype=np.int64)
    has = np.flatnonzero(crowd.gold >= 0)
    n = min(round(fraction * crowd.n_items), at_most, int(has.size))
    if n > 0:
        rng = np.random.default_rng([seed, zlib.crc32(crowd.name.encode())])
        pick = rng.choice(has, size=n, replace=False)
        given[pick] = crowd.gold[pick]
    return given


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _fit(method: Method, crowd: Crowd, given: I64, seed: int, what: str) -> F64:
    _log(f"{crowd.name}: {what}" + (f" (order {seed})" if method.seeded else ""))
    return method.fit(crowd, given, seed)


def run(
    crowds: Sequence[Crowd],
    methods: Sequence[str],
    orders: int = 3,
    gold_fraction: float = 0.0,
    gold_max: int = 50,
    jobs: int = 2,
    gold_draws: int = 1,
) -> list[CrowdResult]:
    """Every method on every crowd; crowd-kit peers not yet cached are fitted in ``jobs``
    forked worker processes while the other methods run here. With gold, every method is run
    and scored once per draw of ``gold_draws`` random gold sets (a few dozen gold items score
    very differently from one draw to the next), seeded methods once per order per draw."""
    results = []
    for crowd in crowds:
        draws = []
        for d in range(max(gold_draws, 1) if gold_fraction > 0 else 1):
            given = choose_gold(crowd, gold_fraction, gold_max, seed=d)
            draws.append((given, np.where(given >= 0, -1, crowd.gold)))
        results.append(CrowdResult(crowd, draws[0][0], draws[0][1], draws=draws))

    pending: list[tuple[CrowdResult, str, Future[tuple[F64, float]]]] = []
    peers = [m for m in methods if METHODS[m].kind == "crowdkit"]
    todo = [(r, m) for r in results for m in peers if not cache_path(r.crowd, m).exists()]
    pool = None
    if todo and jobs > 0:
        # slowest first: the largest answer sets, GLAD and MACE before the others
        slow = {"GLAD": 0, "MACE": 1, "DawidSkene": 2}
        todo.sort(key=lambda rm: (-rm[0].crowd.n_answers, slow.get(rm[1], 3)))
        pool = ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("fork"))
        _log(f"fitting {len(todo)} crowd-kit peers in {jobs} processes (cached afterwards)")
        for r, m in todo:
            pending.append((r, m, pool.submit(_peer_job, m, r.crowd)))
    in_pool = {(id(r), m) for r, m, _ in pending}
    try:
        for r in results:
            for m in methods:
                if (id(r), m) in in_pool:
                    continue
                method = METHODS[m]
                takes_gold = method.kind in ("crowdtally", "reference")
                out = Outcome()
                was_cached = method.kind == "crowdkit" and cache_path(r.crowd, m).exists()
                t0 = time.perf_counter()
                fits: list[F64] = []
                for d, (given, target) in enumerate(r.draws):
                    if takes_gold or d == 0:  # a method without gold: one fit for every draw
                        shown = given if takes_gold else np.full_like(given, -1)
                        what = m + (f" (gold draw {d})" if len(r.draws) > 1 else "")
                        fits = [
                            _fit(method, r.crowd, shown, seed, what)
                            for seed in range(orders if method.seeded else 1)
                        ]
                    for posteriors in fits:
                        out.add(posteriors, target)
                out.seconds = (time.perf_counter() - t0) / len(r.draws)
                if was_cached:
                    out.seconds = float("nan")
                r.outcomes[m] = out
        for r, m, fut in pending:
            posteriors, sec = fut.result()
            out = Outcome(seconds=sec)
            for _, target in r.draws:
                out.add(posteriors, target)
            r.outcomes[m] = out
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    for r in results:  # keep the registry's order
        r.outcomes = {m: r.outcomes[m] for m in methods}
        if r.crowd.oracle is not None:
            oracle = Outcome()
            for _, target in r.draws:
                oracle.add(r.crowd.oracle, target)
            r.outcomes["oracle"] = oracle
    return results


# ---------------------------------------------------------------------------------------
# The report


def _cell(out: Outcome, metric: str, seeded: bool) -> str:
    digits = 2 if metric in ("acc", "ece") else 4
    value = f"{out.mean(metric):.{digits}f}"
    if seeded:
        value += f" ± {out.sd(metric):.{digits}f}"
    return value


def crowd_table(r: CrowdResult) -> str:
    """Method rows: accuracy %, ECE points, NLL, Brier (mean ± sd over orders), fit seconds."""
    c = r.crowd
    n_given, n_scored = int(np.sum(r.given >= 0)), int(np.sum(r.target >= 0))
    regime = ", dense" if c.dense else ", mostly sparse" if c.mostly_sparse else ""
    kind = f"synthetic{regime}: {c.description}" if c.synthetic else f"{c.description}{regime}"
    lines = [
        f"## {c.name} ({kind}; {c.summary()}; {n_given} given as gold, scored on {n_scored})",
        f"{'method':<18}{'acc %':>17}{'ECE':>17}{'NLL':>21}{'Brier':>21}{'fit s':>8}",
    ]
    for m, out in r.outcomes.items():
        seeded = len(out.runs) > 1
        sec = "cached" if np.isnan(out.seconds) else f"{out.seconds:.1f}"
        if m == "oracle":
            sec = ""
        lines.append(
            f"{m:<18}"
            + "".join(
                f"{_cell(out, k, seeded):>{17 if k in ('acc', 'ece') else 21}}" for k in METRICS
            )
            + f"{sec:>8}"
        )
    return "\n".join(lines)


_SHORT = {"OneCoinDawidSkene": "OneCoinDS", "ZeroBasedSkill": "ZBS", "DawidSkene": "DS"}


def _matrix(
    title: str, rows: list[CrowdResult], methods: list[str], metric: str, fmt: str = ".2f"
) -> str:
    head = f"{title:<20}" + "".join(f"{_SHORT.get(m, m)[:10]:>11}" for m in methods)
    lines = [head]
    for r in rows:
        lines.append(
            f"{r.crowd.name:<20}"
            + "".join(
                f"{r.outcomes[m].mean(metric):>11{fmt}}" if m in r.outcomes else f"{'':>11}"
                for m in methods
            )
        )
    means = [np.mean([r.outcomes[m].mean(metric) for r in rows]) for m in methods]
    lines.append(f"{'mean':<20}" + "".join(f"{v:>11{fmt}}" for v in means))
    return "\n".join(lines)


def summary_table(rows: list[CrowdResult], methods: list[str]) -> str:
    """Per method: mean accuracy, mean and max ECE, mean NLL, mean Brier over ``rows``."""
    lines = [f"{'method':<18}{'acc %':>9}{'ECE':>8}{'max ECE':>9}{'NLL':>9}{'Brier':>9}"]
    for m in methods:
        per = {k: [r.outcomes[m].mean(k) for r in rows] for k in METRICS}
        lines.append(
            f"{m:<18}{np.mean(per['acc']):>9.2f}{np.mean(per['ece']):>8.2f}"
            f"{np.max(per['ece']):>9.2f}{np.mean(per['nll']):>9.4f}{np.mean(per['brier']):>9.4f}"
        )
    return "\n".join(lines)


def oracle_gap_table(rows: list[CrowdResult], methods: list[str]) -> str:
    """Accuracy minus the oracle's, per synthetic crowd and method (points)."""
    head = f"{'acc - oracle':<20}{'oracle %':>10}{'regime':>8}" + "".join(
        f"{_SHORT.get(m, m)[:10]:>11}" for m in methods
    )
    lines = [head]
    for r in rows:
        o = r.outcomes["oracle"].mean("acc")
        regime = "dense" if r.crowd.dense else "sparse" if r.crowd.mostly_sparse else "-"
        lines.append(
            f"{r.crowd.name:<20}{o:>10.2f}{regime:>8}"
            + "".join(f"{r.outcomes[m].mean('acc') - o:>11.2f}" for m in methods)
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class Check:
    ok: bool
    text: str

    def __str__(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'}  {self.text}"


def checks(
    shared: list[CrowdResult], syn: list[CrowdResult], methods: list[str], gold_fraction: float
) -> list[Check]:
    """The quality targets, for every crowdtally method."""
    out: list[Check] = []
    ours = [m for m in methods if METHODS[m].kind == "crowdtally"]
    peers = [m for m in methods if METHODS[m].kind in ("baseline", "crowdkit")]
    ck = [m for m in methods if METHODS[m].kind == "crowdkit"]
    with_gold = gold_fraction > 0
    mode = f"{gold_fraction:.0%} gold" if with_gold else "no gold"
    for m in ours if shared else []:
        eces = np.array([r.outcomes[m].mean("ece") for r in shared])
        worst = shared[int(eces.argmax())].crowd.name
        lim_mean, lim_max = (3.0, 6.0) if with_gold else (6.0, 12.0)
        out.append(
            Check(
                bool(eces.mean() <= lim_mean),
                f"[{mode}] {m}: mean ECE {eces.mean():.2f} <= {lim_mean} (shared sets)",
            )
        )
        out.append(
            Check(
                bool(eces.max() <= lim_max),
                f"[{mode}] {m}: max ECE {eces.max():.2f} ({worst}) <= {lim_max}",
            )
        )
        if with_gold:
            continue
        for p in peers:
            pe = np.mean([r.outcomes[p].mean("ece") for r in shared])
            out.append(
                Check(
                    bool(eces.mean() < pe),
                    f"[{mode}] {m}: mean ECE {eces.mean():.2f} < {p} {pe:.2f}",
                )
            )
        nl = np.mean([r.outcomes[m].mean("nll") for r in shared])
        out.append(Check(bool(nl <= 0.75), f"[{mode}] {m}: mean NLL {nl:.4f} <= 0.75"))
        acc = np.array([r.outcomes[m].mean("acc") for r in shared])
        out.append(
            Check(bool(acc.mean() >= 82.5), f"[{mode}] {m}: mean acc {acc.mean():.2f} >= 82.5")
        )
        if ck:
            best = np.array([max(r.outcomes[p].mean("acc") for p in ck) for r in shared])
            gap = acc - best
            worst_i = int(gap.argmin())
            out.append(
                Check(
                    bool(gap.min() >= -2.0),
                    f"[{mode}] {m}: acc - best crowd-kit >= -2.0 on every set (worst "
                    f"{gap.min():+.2f} on {shared[worst_i].crowd.name})",
                )
            )
    for m in ours:
        for r in syn:
            e = r.outcomes[m].mean("ece")
            out.append(Check(bool(e <= 3.0), f"[{mode}] {m} on {r.crowd.name}: ECE {e:.2f} <= 3.0"))
            gap = r.outcomes[m].mean("acc") - r.outcomes["oracle"].mean("acc")
            if r.crowd.dense or r.crowd.mostly_sparse:
                lim = 1.0 if r.crowd.dense else 3.0
                out.append(
                    Check(
                        bool(gap >= -lim),
                        f"[{mode}] {m} on {r.crowd.name}: acc - oracle {gap:+.2f} >= -{lim}",
                    )
                )
    return out


def reliability_figure(shared: list[CrowdResult], methods: Sequence[str], path: Path) -> None:
    """Observed accuracy against confidence per bin, pooled over the shared datasets."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6.0, 7.0), height_ratios=[3, 1], sharex=True)
    top.plot([0, 1], [0, 1], color="0.6", linestyle="--", linewidth=1, label="perfect calibration")
    edges = np.linspace(0, 1, N_BINS + 1)
    width = 1.0 / N_BINS / (len(methods) + 1)
    for j, m in enumerate(methods):
        pooled: Bins | None = None
        for r in shared:
            b = r.outcomes[m].bins
            if b is not None:
                pooled = b if pooled is None else pooled + b
        if pooled is None:
            continue
        has = pooled.count > 0
        top.plot(
            pooled.mean_confidence()[has],
            pooled.observed_accuracy()[has],
            marker="o",
            label=f"{m} (ECE {pooled.ece():.1f})",
        )
        bottom.bar(
            edges[:-1] + (j + 0.5) * width, pooled.count / pooled.count.sum(), width=width, label=m
        )
    top.set_ylabel("observed accuracy")
    top.set_xlim(0, 1)
    top.set_ylim(0, 1)
    top.set_title("Reliability, pooled over the shared datasets")
    top.legend(loc="upper left", fontsize=8)
    bottom.set_xlabel("top-label confidence")
    bottom.set_ylabel("share of items")
    bottom.set_yscale("log")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _to_json(
    results: list[CrowdResult], found: list[Check], args: dict[str, Any]
) -> dict[str, Any]:
    return {
        "args": args,
        "checks": [{"ok": c.ok, "text": c.text} for c in found],
        "crowds": {
            r.crowd.name: {
                "synthetic": r.crowd.synthetic,
                "description": r.crowd.description,
                "summary": r.crowd.summary(),
                "dense": r.crowd.dense,
                "mostly_sparse": r.crowd.mostly_sparse,
                "n_given": int(np.sum(r.given >= 0)),
                "n_scored": int(np.sum(r.target >= 0)),
                "methods": {
                    m: {
                        "runs": o.runs,
                        "seconds": None if np.isnan(o.seconds) else o.seconds,
                        "bins": None
                        if o.bins is None
                        else {
                            "count": o.bins.count.tolist(),
                            "confidence_sum": o.bins.confidence.tolist(),
                            "correct_sum": o.bins.correct.tolist(),
                        },
                    }
                    for m, o in r.outcomes.items()
                },
            }
            for r in results
        },
    }


def _names(text: str, known: Sequence[str], what: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in known]
    if bad:
        raise SystemExit(f"unknown {what}: {bad}; expected some of {list(known)}")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments, run, print the report; returns 0."""
    ap = argparse.ArgumentParser(
        prog="python -m bench.quality", description=(__doc__ or "").splitlines()[0]
    )
    ap.add_argument("--datasets", default=None, help="comma-separated shared sets (default: all)")
    ap.add_argument(
        "--synthetic",
        default=",".join(SYNTHETIC),
        help=f"comma-separated regimes of {list(SYNTHETIC)}, or 'none'",
    )
    ap.add_argument("--methods", default=None, help="comma-separated (default: all registered)")
    ap.add_argument("--no-peers", action="store_true", help="skip the crowd-kit methods")
    ap.add_argument("--orders", type=int, default=3, help="random orders of seeded methods")
    ap.add_argument("--gold-fraction", type=float, default=0.0)
    ap.add_argument("--gold-max", type=int, default=50)
    ap.add_argument(
        "--gold-draws", type=int, default=1, help="random gold sets per crowd (with gold)"
    )
    ap.add_argument("--jobs", type=int, default=2, help="processes fitting crowd-kit peers")
    ap.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="shared datasets folder")
    ap.add_argument("--figure", type=Path, default=None, help="reliability diagram PNG")
    ap.add_argument("--json", type=Path, default=None, help="dump every number here")
    args = ap.parse_args(argv)

    t_start = time.perf_counter()
    all_sets = dataset_names(args.root)
    sets = all_sets if args.datasets is None else _names(args.datasets, all_sets, "datasets")
    regimes = (
        []
        if args.synthetic.strip() == "none"
        else _names(args.synthetic, list(SYNTHETIC), "regimes")
    )
    methods = (
        list(METHODS) if args.methods is None else _names(args.methods, list(METHODS), "methods")
    )
    if args.no_peers:
        methods = [m for m in methods if METHODS[m].kind != "crowdkit"]
    crowds = [load_shared(n, args.root) for n in sets] + [synthetic(n) for n in regimes]
    results = run(
        crowds, methods, args.orders, args.gold_fraction, args.gold_max, args.jobs, args.gold_draws
    )
    shared = [r for r in results if not r.crowd.synthetic]
    syn = [r for r in results if r.crowd.synthetic]
    with_gold = args.gold_fraction > 0

    mode = (
        f"gold given on {args.gold_fraction:.0%} of each crowd's items (at most {args.gold_max}), "
        f"scored on the others; {args.gold_draws} random gold set(s) per crowd"
        if with_gold
        else "no gold given, scored on every item with gold"
    )
    print(f"# bench.quality: {mode}")
    print(
        f"# online: one pass in a random order, mean ± sd over {args.orders} orders; "
        "ECE in points (10 bins); NLL of the gold label; Brier summed over classes\n"
    )
    for r in results:
        print(crowd_table(r) + "\n")
    if shared:
        print(f"# shared datasets ({len(shared)}): mean over sets")
        print(summary_table(shared, methods) + "\n")
        print(_matrix("accuracy %", shared, methods, "acc") + "\n")
        print(_matrix("ECE (points)", shared, methods, "ece") + "\n")
        print(_matrix("NLL", shared, methods, "nll", ".3f") + "\n")
    if syn:
        print(f"# synthetic crowds ({len(syn)}): mean over crowds")
        print(summary_table(syn, [*methods, "oracle"]) + "\n")
        print(_matrix("accuracy %", syn, [*methods, "oracle"], "acc") + "\n")
        print(_matrix("ECE (points)", syn, [*methods, "oracle"], "ece") + "\n")
        print(oracle_gap_table(syn, methods) + "\n")
    found = checks(shared, syn, methods, args.gold_fraction)
    print(f"# checks ({sum(c.ok for c in found)} of {len(found)} pass)")
    for c in found:
        print(c)
    if args.figure is not None and shared:
        shown = [m for m in ("online", "batch", "MV", "DawidSkene") if m in methods]
        reliability_figure(shared, shown, args.figure)
        print(f"\nfigure: {args.figure}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        info = {k: str(v) for k, v in vars(args).items()}
        args.json.write_text(json.dumps(_to_json(results, found, info), indent=1))
        print(f"numbers: {args.json}")
    print(f"\nwall time {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
