"""Replay bench for active label acquisition: ``python -m bench.active``.

A campaign replays a crowd's real answers: each item starts with one of its answers (chosen
at random); at each step a policy picks a batch of items (``--step`` of the items, at least
one) and each picked item reveals one more of *its own* answers, with the worker who gave
it (a policy may choose which of those workers; otherwise the next one in a random order
fixed per campaign). An item whose answers are all revealed is finished. Every policy sees
the same random orders (common random numbers): campaign s of one policy is paired with
campaign s of every other.

The model is the service's own engine (``app.engine.project.ProjectEngine``), fed the
entries the service would log: each step's answers as a ``labels`` entry and a ``refine``
sweep every ``--refresh`` steps (the engine's idle sweep). At every checkpoint
(``--checkpoint`` of the answers) what a refit would serve gives the curve's accuracy on the gold
items: batch EM on the revealed answers, outside the engine, or the engine's served model where
the service would decline that fit (its labels too far from the served ones). The service's policies (voi,
uncertainty, entropy, margin, uniform) rank items by the queue the engine writes to the
store, read back in the store's order (score, then arrival): the ranking the service serves.

Peers: ``fixed3`` and ``fixed5`` (round robin up to 3 or 5 answers an item, then the
campaign stops: what requesters do today); ``opt_kg``, the optimistic knowledge gradient of
Chen, Lin & Zhou (ICML 2013), on Dirichlet vote counts; on synthetic crowds ``oracle``, the
default policy's ranking on the exact posterior under the true parameters. Registered, not
run by default: ``voi_worker``, ``entropy_worker``, ``least_confident``, ``hmin`` and
``clairvoyant`` (a ceiling that reads the gold: the items the last checkpoint got wrong first).

The yardstick is batch EM on *all* the answers; "labels needed" counts every label up to
the checkpoint after which accuracy stays within 0.5 point of it. Writes bench/out/active.png
(accuracy against labels bought), active.csv (the curves) and active.md (the tables).
"""

from __future__ import annotations

import argparse
import csv
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from app.engine.project import ProjectEngine
from app.engine.queue import arrival_of
from app.store.base import EntryKind, LogEntry, ProjectRecord
from bench.crowds import SYNTHETIC, Crowd, load_shared, synthetic
from bench.datasets import dataset_names
from core import acquisition as acq
from core.blocks import FloatArray, IntArray, LabelBlocks
from core.dyadic import DyadicConfig, DyadicModel
from core.nominal import NominalConfig
from core.pooling import fit_pooled

OUT = Path(__file__).resolve().parent / "out"
TOLERANCE = 0.005  # "within 0.5 point" of full-data batch EM
BUDGETS = (0.25, 0.5, 0.75)  # fixed budgets, shares of the campaign's answers
REFINE_PASSES = 3  # the engine's idle sweep (EngineLoop.refine_passes)
DEFAULT_POLICY = "lookahead"  # QueueSettings' default: what every project's queue serves
QUEUE_POLICIES = ("voi", "lookahead", "uncertainty", "entropy", "margin", "uniform")


def load_crowd(name: str, seed: int = 0) -> Crowd:
    """A shared dataset, or ``syn_<regime>`` for a synthetic crowd of ``bench.crowds``."""
    if name.startswith("syn_"):
        return synthetic(name[4:], seed)
    return load_shared(name)


@dataclass
class Campaign:
    """One replay: a crowd's answers in a fixed random order per item, a revealed prefix each,
    applied by the service's engine as they are revealed."""

    crowd: Crowd
    order: IntArray  # answer indices grouped by item, random order inside an item
    start: IntArray  # order[start[i]:start[i+1]] are item i's answers
    revealed: IntArray  # how many of item i's answers are revealed (a prefix of its order)
    rng: np.random.Generator
    engine: ProjectEngine
    item_ids: list[str]
    worker_ids: list[str]
    code: IntArray = field(init=False)  # the engine's code of each item (arrival order)
    score: FloatArray = field(init=False)  # the engine's queue score per item (NaN: not queued)
    votes: IntArray = field(init=False)  # revealed answers per item and class
    cache: dict[str, Any] = field(default_factory=dict)  # a policy's own state

    @classmethod
    def start_from(cls, crowd: Crowd, seed: int, queue_policy: str = "uniform") -> Campaign:
        rng = np.random.default_rng(seed)
        perm = rng.permutation(crowd.n_answers)
        order = perm[np.argsort(crowd.item[perm], kind="stable")]
        counts = np.bincount(crowd.item, minlength=crowd.n_items)
        start = np.zeros(crowd.n_items + 1, dtype=np.int64)
        np.cumsum(counts, out=start[1:])
        config = {**NominalConfig(n_classes=crowd.n_classes).to_dict(), "dyadic": None}
        engine = ProjectEngine(ProjectRecord("replay", crowd.classes, config, 0.0))
        names = crowd.worker_names or tuple(str(w) for w in range(crowd.n_workers))
        c = cls(
            crowd, order, start, np.zeros(crowd.n_items, dtype=np.int64), rng, engine,
            [str(i) for i in range(crowd.n_items)], list(names),
        )  # fmt: skip
        c.code = np.full(crowd.n_items, -1, dtype=np.int64)
        c.score = np.full(crowd.n_items, np.nan)
        c.votes = np.zeros((crowd.n_items, crowd.n_classes), dtype=np.int64)
        queue = {"policy": queue_policy, "target_confidence": 1.0}
        c.log("settings", {"queue": {**queue, "max_labels_per_item": None, "budget": None}})
        c.reveal(rng.permutation(crowd.n_items))  # each item's first answer, in random order
        return c

    # -- bookkeeping --------------------------------------------------------------------
    @property
    def counts(self) -> IntArray:
        out: IntArray = np.diff(self.start)
        return out

    @property
    def labels_used(self) -> int:
        return int(self.revealed.sum())

    def remaining_answers(self) -> tuple[IntArray, IntArray]:
        """Every unrevealed answer index and its item."""
        return self._answers(self.start[:-1] + self.revealed, self.counts - self.revealed)

    def revealed_answers(self) -> tuple[IntArray, IntArray]:
        """Every revealed answer index and its item."""
        return self._answers(self.start[:-1], self.revealed)

    def _answers(self, first: IntArray, n: IntArray) -> tuple[IntArray, IntArray]:
        """order[first[i] : first[i] + n[i]] of every item i, and the item of each."""
        items = np.repeat(np.arange(n.size), n)
        ptr = np.cumsum(n) - n
        return self.order[first[items] + np.arange(items.size) - ptr[items]], items

    def served(self) -> FloatArray:
        """Every item's posterior as the service serves it (calibrated, docs/model.md eq. 24)."""
        e = self.engine
        out: FloatArray = e.calibration.from_posteriors(e.q[self.code], e.weight[self.code])
        return out

    def worker_confusions(self, workers: IntArray) -> FloatArray:
        """(n, K, K): each worker's confusion in the engine; the typical worker's if unseen."""
        e = self.engine
        params = e.online.params
        out = np.repeat(params.population_confusion()[None], workers.size, axis=0)
        codes = np.array([e.workers.code.get(self.worker_ids[w], -1) for w in workers.tolist()])
        seen = codes >= 0
        if seen.any():
            out[seen] = params.worker_confusion(e.worker_row[codes[seen]])
        return out

    # -- the engine, fed as the service feeds it ---------------------------------------
    def log(self, kind: EntryKind, body: dict[str, Any]) -> None:
        """Apply one log entry, then read back the queue the engine would write."""
        e = self.engine
        e.apply(LogEntry(e.position + 1, kind, orjson.dumps(body)))
        update = e.state_update()
        if update.queue_replace:
            self.score[:] = np.nan
        arrived = np.flatnonzero(self.code < 0)
        if arrived.size:  # items the engine has met since: their codes
            known = [e.items.code.get(self.item_ids[i], -1) for i in arrived.tolist()]
            self.code[arrived] = known
        item_of_code = self.cache.setdefault("item_of_code", {})
        if len(item_of_code) < e.items_count:
            for i in np.flatnonzero(self.code >= 0).tolist():
                item_of_code[int(self.code[i])] = i
        for member in update.queue_remove:
            self.score[item_of_code[arrival_of(member)]] = np.nan
        for member, value in update.queue.items():
            self.score[item_of_code[arrival_of(member)]] = value

    def reveal(self, items: IntArray, answer: IntArray | None = None) -> None:
        """Reveal one more real answer of each item: the next in its order, or the given
        answer index (one of its unrevealed answers), which is swapped to the front."""
        if answer is not None:
            for i, a in zip(items.tolist(), answer.tolist(), strict=True):
                head = self.start[i] + self.revealed[i]
                mine = self.order[self.start[i] : self.start[i + 1]]
                at = self.start[i] + int(np.flatnonzero(mine == a)[0])
                if at < head:
                    raise ValueError("that answer is already revealed")
                self.order[head], self.order[at] = self.order[at], self.order[head]
        if np.any(self.revealed[items] >= self.counts[items]):
            raise ValueError("an item has no real answer left")
        taken = self.order[self.start[items] + self.revealed[items]]
        self.revealed[items] += 1
        cw = self.crowd
        np.add.at(self.votes, (items, cw.label[taken]), 1)
        ids, workers = self.item_ids, self.worker_ids
        self.log(
            "labels",
            {
                "items": [ids[i] for i in cw.item[taken].tolist()],
                "workers": [workers[w] for w in cw.worker[taken].tolist()],
                "labels": cw.label[taken].tolist(),
                "weights": None,
            },
        )

    def refine(self) -> None:
        self.log("refine", {"passes": REFINE_PASSES})

    def measure(self) -> float:
        """What the service serves after a refit (``POST .../refit``): batch EM on the revealed
        answers (exact workers), or the served model where the service declines that fit
        (``ProjectEngine.refit_verdict``); its accuracy on the gold items. The engine
        does not see it: the policies rank on what the service serves without a refit."""
        cw = self.crowd
        idx, _ = self.revealed_answers()
        blocks = LabelBlocks.group(cw.item[idx], cw.worker[idx], cw.label[idx],
                                   np.ones(idx.size), n_blocks=cw.n_items)  # fmt: skip
        config = NominalConfig(n_classes=cw.n_classes)  # (the worker prior as the refit's, eq. 28)
        probas = fit_pooled(config, blocks, cw.n_workers).result.probas
        labels = probas.argmax(axis=1)
        e = self.engine
        by_code = np.empty_like(probas)
        by_code[self.code] = probas  # (every item arrived with the campaign's first entry)
        if not e.refit_verdict(by_code, e.position)["adopted"]:
            labels = e.shown(self.code).argmax(axis=1)
        self.cache["measured_labels"] = labels  # what ``clairvoyant`` reads
        has = cw.gold >= 0
        return float(np.mean(labels[has] == cw.gold[has]))

    def oracle(self) -> FloatArray:
        """The exact posterior of the revealed answers under the true parameters."""
        cw = self.crowd
        assert cw.answer_loglik is not None and cw.log_prior is not None
        idx, _ = self.revealed_answers()
        logpost = np.tile(cw.log_prior, (cw.n_items, 1))
        for z in range(cw.n_classes):
            logpost[:, z] += np.bincount(
                cw.item[idx], weights=cw.answer_loglik[idx, z], minlength=cw.n_items
            )
        post = np.exp(logpost - logpost.max(axis=1, keepdims=True))
        out: FloatArray = post / post.sum(axis=1, keepdims=True)
        return out


# A policy picks the items to reveal next (and optionally which of their real answers).
Pick = Callable[[Campaign, int], tuple[IntArray, IntArray | None]]


@dataclass(frozen=True)
class Policy:
    pick: Pick
    queue: str = "uniform"  # the engine's queue policy during the campaign
    redundancy: int | None = None  # stop once every item has this many answers
    synthetic_only: bool = False


def _open(c: Campaign) -> acq.BoolArray:
    """Items with an answer left to reveal."""
    out: acq.BoolArray = c.revealed < c.counts
    return out


def _pick(c: Campaign, scores: FloatArray, n: int) -> IntArray:
    """The n best-scoring open items; ties in arrival order (the engine's item codes)."""
    by_arrival = c.cache.get("by_arrival")
    if by_arrival is None:  # every item arrived with the campaign's first entry
        by_arrival = c.cache["by_arrival"] = np.argsort(c.code, kind="stable")
    chosen = acq.select(scores[by_arrival], ~_open(c)[by_arrival], limit=n)
    out: IntArray = by_arrival[chosen]
    return out


def served_queue(c: Campaign, n: int) -> tuple[IntArray, IntArray | None]:
    """The top of the queue the service serves (``GET .../queue``), open items only."""
    return _pick(c, c.score, n), None


def fixed(r: int) -> Pick:
    def pick(c: Campaign, n: int) -> tuple[IntArray, IntArray | None]:
        """Round robin up to ``r`` answers an item (fewest first, ties in arrival order)."""
        score = np.where(c.revealed < r, -c.revealed.astype(np.float64), np.nan)
        return _pick(c, score, n), None

    return pick


def _prob_largest(alpha: FloatArray) -> FloatArray:
    """P(θ_k is the largest | θ ~ Dirichlet(α)) per row: for two classes the Beta tail, else
    ∫ f_Γ(x; α_k) Π_{j≠k} F_Γ(x; α_j) dx (θ = normalised Gammas), by quadrature."""
    from scipy import special, stats  # here: scipy.stats alone takes about 1 s to import

    if alpha.shape[1] == 2:
        p0 = special.betainc(alpha[:, 1], alpha[:, 0], 0.5)  # P(θ_0 > 1/2)
        out: FloatArray = np.stack([p0, 1 - p0], axis=1)
        return out
    top = alpha.max(axis=1)
    hi = top + 12 * np.sqrt(top) + 12
    x = np.linspace(0, 1, 257)[1:][None, :] * hi[:, None]  # (n, m)
    pdf = stats.gamma.pdf(x[:, None, :], alpha[:, :, None])  # (n, K, m)
    cdf = special.gammainc(alpha[:, :, None], x[:, None, :])
    others = np.prod(cdf, axis=1, keepdims=True) / np.maximum(cdf, 1e-300)
    p = np.trapezoid(pdf * others, x[:, None, :], axis=2)
    out = p / p.sum(axis=1, keepdims=True)
    return out


def opt_kg(c: Campaign, n: int) -> tuple[IntArray, IntArray | None]:
    """Optimistic knowledge gradient (Chen, Lin & Zhou 2013, eq. 12 with a Dirichlet(1) prior
    on each item's answer distribution, workers alike): an item's reward is the largest
    gain, over the answers it could receive next, of h(α) = max_k P(θ_k largest | α)."""
    K = c.crowd.n_classes
    stale = c.cache.get("kg_votes")
    reward = c.cache.setdefault("kg_reward", np.zeros(c.crowd.n_items))
    todo = (
        np.arange(c.crowd.n_items) if stale is None else np.flatnonzero((c.votes != stale).any(1))
    )
    if todo.size:
        alpha = 1.0 + c.votes[todo].astype(np.float64)
        now = _prob_largest(alpha).max(axis=1)
        gain = np.empty((todo.size, K))
        for k in range(K):
            more = alpha.copy()
            more[:, k] += 1
            gain[:, k] = _prob_largest(more).max(axis=1) - now
        reward[todo] = gain.max(axis=1)
        c.cache["kg_votes"] = c.votes.copy()
    return _pick(c, reward, n), None


def oracle(c: Campaign, n: int) -> tuple[IntArray, IntArray | None]:
    """The default policy's ranking on the exact posterior under the true parameters."""
    q = c.oracle()
    C = c.engine.online.params.population_confusion()
    return _pick(c, acq.priority(DEFAULT_POLICY, q, c.revealed, C), n), None  # type: ignore[arg-type]


def clairvoyant(c: Campaign, n: int) -> tuple[IntArray, IntArray | None]:
    """A ceiling, not a policy: it reads the gold. The items the last checkpoint got wrong
    first, then the items without gold, then those it got right; fewest answers
    first within each. What a campaign could save if it knew where its mistakes are."""
    cw = c.crowd
    labels = c.cache["measured_labels"]  # every campaign is measured before its first pick
    has = cw.gold >= 0
    tier = np.where(has & (labels != cw.gold), 2.0, np.where(has, 0.0, 1.0))
    return _pick(c, tier - c.revealed / (cw.n_answers + 1.0), n), None


def least_confident(c: Campaign, n: int) -> tuple[IntArray, IntArray | None]:
    """Largest chance that the most likely label is wrong (eq. A1), on the served posterior."""
    return _pick(c, acq.error_probability(c.served()), n), None


def _pair_scores(c: Campaign, answers: IntArray, items: IntArray) -> FloatArray:
    """VOI of each unrevealed real answer (item, worker) under that worker's own confusion,
    with the queue's tie-breaks (``acquisition.priority``)."""
    workers, which = np.unique(c.crowd.worker[answers], return_inverse=True)
    conf = c.worker_confusions(workers)
    q = c.served()[items]
    one = acq.value_of_information(q, conf, index=which)
    two = acq.value_of_information(q, conf, lookahead=2, index=which)
    out: FloatArray = one + 1e-3 * two + 1e-6 * acq.entropy(q)
    return out


def _best_answer_of(
    items: IntArray, answers: IntArray, score: FloatArray, picked: IntArray
) -> IntArray:
    """For each picked item, its unrevealed answer with the highest score (first on ties)."""
    order = np.lexsort((-score, items))  # by item, best first
    first = np.ones(order.size, dtype=bool)
    first[1:] = items[order][1:] != items[order][:-1]
    best_of = dict(zip(items[order][first].tolist(), answers[order][first].tolist(), strict=True))
    return np.array([best_of[i] for i in picked.tolist()], dtype=np.int64)


def voi_worker(c: Campaign, n: int) -> tuple[IntArray, IntArray | None]:
    """For every unrevealed real (item, worker) pair, VOI under that worker's own confusion;
    each item scores its best remaining worker, whose answer is revealed."""
    answers, items = c.remaining_answers()
    pair = _pair_scores(c, answers, items)
    best = np.full(c.crowd.n_items, -np.inf)
    np.maximum.at(best, items, pair)
    picked = _pick(c, best, n)
    return picked, _best_answer_of(items, answers, pair, picked)


def entropy_worker(c: Campaign, n: int) -> tuple[IntArray, IntArray | None]:
    """Items by the served queue (entropy); each reveals the answer of its remaining real
    worker with the largest per-worker VOI."""
    picked, _ = served_queue(c, n)
    answers, items = c.remaining_answers()
    mine = np.isin(items, picked)
    answers, items = answers[mine], items[mine]
    return picked, _best_answer_of(items, answers, _pair_scores(c, answers, items), picked)


def hmin(c: Campaign, n: int) -> tuple[IntArray, IntArray | None]:
    """Near the boundary: a dyadic model (core.dyadic, k=2, hinge, l2 0.2) learns every
    revealed (worker, item, answer); for every unrevealed real (item, worker) pair, h_min is
    the smallest importance weight that would flip the label the model predicts that worker
    gives that item. Items are ranked by their smallest h_min, and that worker's answer is
    revealed."""
    cw = c.crowd
    model: DyadicModel | None = c.cache.get("dyadic")
    if model is None:
        cfg = DyadicConfig(n_classes=cw.n_classes, k=2, loss="hinge", l2=0.2, dyadic_rate=1.0,
                           rater_slots=max(1, cw.n_workers), task_slots=max(1, cw.n_items))  # fmt: skip
        model = c.cache["dyadic"] = DyadicModel(cfg)
        c.cache["dyadic_seen"] = np.zeros(cw.n_items, dtype=np.int64)
    seen: IntArray = c.cache["dyadic_seen"]
    new = np.flatnonzero(c.revealed > seen)
    if new.size:  # train on the answers revealed since the last call, in order
        take = np.concatenate(
            [c.order[c.start[i] + seen[i] : c.start[i] + c.revealed[i]] for i in new.tolist()]
        )
        model.learn_many(cw.worker[take], cw.item[take], cw.label[take], np.ones(take.size))
        seen[new] = c.revealed[new]
    answers, items = c.remaining_answers()
    h = model.h_min(cw.worker[answers], items)
    h = np.where(np.isfinite(h), h, 1e12)
    smallest = np.full(cw.n_items, np.inf)
    np.minimum.at(smallest, items, h)
    picked = _pick(c, -smallest, n)
    return picked, _best_answer_of(items, answers, -h, picked)


POLICIES: dict[str, Policy] = {
    **{p: Policy(served_queue, queue=p) for p in QUEUE_POLICIES},
    "fixed3": Policy(fixed(3), redundancy=3),
    "fixed5": Policy(fixed(5), redundancy=5),
    "opt_kg": Policy(opt_kg),
    "oracle": Policy(oracle, synthetic_only=True),
    "clairvoyant": Policy(clairvoyant),
    "least_confident": Policy(least_confident),
    "voi_worker": Policy(voi_worker),
    "entropy_worker": Policy(entropy_worker, queue="entropy"),
    "hmin": Policy(hmin),
}
DEFAULT_POLICIES = "uniform,fixed3,fixed5,entropy,opt_kg,voi,oracle"


@dataclass
class Curve:
    labels: list[int] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)

    def needed(self, target: float, sustained: bool = True) -> int:
        """Labels at the first checkpoint within TOLERANCE of ``target`` (``sustained``: from
        which on every checkpoint is); all the answers when there is none."""
        ok = np.asarray(self.accuracy) >= target - TOLERANCE - 1e-12
        if sustained:
            ok = np.logical_and.accumulate(ok[::-1])[::-1]
        hit = np.flatnonzero(ok)
        return self.labels[int(hit[0])] if hit.size else self.labels[-1]

    def at(self, labels: float) -> float:
        """Accuracy with ``labels`` bought: the last checkpoint at or before it (a campaign
        that stopped earlier keeps its final accuracy)."""
        i = int(np.searchsorted(self.labels, labels, side="right")) - 1
        return self.accuracy[max(i, 0)]


def replay(
    crowd: Crowd, policy: str, seed: int, step: float, checkpoint: float, refresh: int
) -> Curve:
    """One campaign; stops when every answer is revealed (or the policy's redundancy is met)."""
    pol = POLICIES[policy]
    c = Campaign.start_from(crowd, seed, pol.queue)
    total = crowd.n_answers
    per_step = max(1, round(step * crowd.n_items))
    every = max(1, round(checkpoint * total))
    curve = Curve()
    next_check, steps = c.labels_used, 0
    while True:
        if c.labels_used >= next_check or c.labels_used == total:
            curve.labels.append(c.labels_used)
            curve.accuracy.append(c.measure())
            next_check = c.labels_used + every
            if c.labels_used == total:
                return curve
        items, answers = pol.pick(c, min(per_step, next_check - c.labels_used))
        if items.size == 0:
            if pol.redundancy is not None:  # done: every item has its r answers
                if curve.labels[-1] != c.labels_used:
                    curve.labels.append(c.labels_used)
                    curve.accuracy.append(c.measure())
                return curve
            items, answers = fixed(total)(c, per_step)  # nothing ranked: fewest first
        c.reveal(items, answers)
        steps += 1
        if steps % refresh == 0:
            c.refine()


def full_data_target(crowd: Crowd) -> float:
    """Batch EM on all the answers (its worker prior chosen as a refit's): accuracy on gold."""
    config = NominalConfig(n_classes=crowd.n_classes)
    exact = LabelBlocks.group(crowd.item, crowd.worker, crowd.label, np.ones(crowd.n_answers),
                              n_blocks=crowd.n_items)  # fmt: skip
    full = fit_pooled(config, exact, crowd.n_workers).result
    has = crowd.gold >= 0
    return float(np.mean(full.labels[has] == crowd.gold[has]))


# -- the run -------------------------------------------------------------------------------
Curves = dict[str, dict[str, list[Curve]]]  # dataset -> policy -> one curve per campaign


def _crowd(name: str) -> Crowd:
    crowd = _CROWDS.get(name)
    if crowd is None:
        crowd = _CROWDS[name] = load_crowd(name)
    return crowd


_CROWDS: dict[str, Crowd] = {}


def _task(args: tuple[str, str, int, float, float, int]) -> tuple[str, str, int, Curve, float]:
    name, policy, seed, step, checkpoint, refresh = args
    t0 = time.perf_counter()
    curve = replay(_crowd(name), policy, seed, step, checkpoint, refresh)
    return name, policy, seed, curve, time.perf_counter() - t0


def run(
    names: list[str], policies: list[str], seeds: int, step: float, checkpoint: float,
    refresh: int, jobs: int,
) -> Curves:  # fmt: skip
    """Every (dataset, policy, campaign), over ``jobs`` processes; progress on stdout."""
    tasks = [
        (name, p, s, step, checkpoint, refresh)
        for name in names
        for p in policies
        if not (POLICIES[p].synthetic_only and not name.startswith("syn_"))
        for s in range(seeds)
    ]
    out: dict[str, dict[str, dict[int, Curve]]] = {n: {} for n in names}
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for k, (name, p, s, curve, took) in enumerate(pool.map(_task, tasks), start=1):
            out[name].setdefault(p, {})[s] = curve
            print(f"[{k}/{len(tasks)} {time.perf_counter() - t0:6.0f}s] {name} {p} "
                  f"campaign {s}: {took:.1f}s", flush=True)  # fmt: skip
    return {n: {p: [c[s] for s in sorted(c)] for p, c in d.items()} for n, d in out.items()}


# -- the tables ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    accuracy: float
    answers: int
    items: int


def savings(curves: list[Curve], uniform: list[Curve], target: float) -> tuple[float, float, float]:
    """Labels saved against uniform, counted until accuracy stays within 0.5 point: of the
    campaigns' mean (1 - mean needed / uniform's), the worst paired campaign, and the
    spread (standard deviation) of the paired campaigns' savings."""
    need = np.array([c.needed(target) for c in curves], dtype=np.float64)
    base = np.array([c.needed(target) for c in uniform], dtype=np.float64)
    paired = 1.0 - need / base
    return float(1.0 - need.mean() / base.mean()), float(paired.min()), float(paired.std())


def report(curves: Curves, targets: dict[str, Target], header: str) -> str:
    names = list(curves)
    seen = {p for d in curves.values() for p in d}
    policies = [p for p in POLICIES if p in seen]
    choosers = [p for p in policies if POLICIES[p].redundancy is None and p != "uniform"]
    real = [n for n in names if not n.startswith("syn_")]
    lines = [header, ""]
    lines += [
        "Labels saved against uniform, counted until accuracy stays within "
        f"{100 * TOLERANCE:.1f} point of batch EM on all the answers: mean over the campaigns "
        "(the worst paired campaign, the spread)",
        "",
        "| dataset | answers | items | target % | uniform needs | "
        + " | ".join(choosers) + " |",
        "|---" * (5 + len(choosers)) + "|",
    ]  # fmt: skip
    mean_saving: dict[str, list[float]] = {p: [] for p in choosers}
    for name in names:
        t = targets[name]
        base = curves[name]["uniform"]
        cells = []
        for p in choosers:
            if p not in curves[name]:
                cells.append("")
                continue
            m, worst, sd = savings(curves[name][p], base, t.accuracy)
            if name in real:
                mean_saving[p].append(m)
            cells.append(f"{100 * m:.1f}% ({100 * worst:.0f}, ±{100 * sd:.0f})")
        need = np.mean([c.needed(t.accuracy) for c in base])
        lines.append(
            f"| {name} | {t.answers} | {t.items} | {100 * t.accuracy:.2f} | {need:.0f} | "
            + " | ".join(cells) + " |"
        )  # fmt: skip
    lines.append(
        "| mean of the shared sets | | | | | "
        + " | ".join(f"{100 * np.mean(v):.1f}%" if v else "" for v in mean_saving.values())
        + " |"
    )
    lines.append("")
    for budget in BUDGETS:
        lines += [
            f"Accuracy (%) with {budget:.0%} of the campaign's answers bought, mean over the "
            "campaigns (fixedR: its final accuracy if it stopped earlier, with the share of the "
            "answers it bought)",
            "",
            "| dataset | " + " | ".join(policies) + " |",
            "|---" * (1 + len(policies)) + "|",
        ]
        for name in names:
            cells = []
            for p in policies:
                cs = curves[name].get(p)
                if not cs:
                    cells.append("")
                    continue
                acc = 100 * np.mean([c.at(budget * targets[name].answers) for c in cs])
                cell = f"{acc:.2f}"
                if POLICIES[p].redundancy is not None:
                    share = np.mean([c.labels[-1] for c in cs]) / targets[name].answers
                    cell += f" ({min(share, budget):.0%})"
                cells.append(cell)
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += verdicts(curves, targets, real, mean_saving)
    return "\n".join(lines)


def verdicts(
    curves: Curves, targets: dict[str, Target], real: list[str], mean_saving: dict[str, list[float]]
) -> list[str]:
    """The acceptance figures, each stated with what it compares."""
    d, out = DEFAULT_POLICY, []
    if mean_saving.get(d):
        worst_set = min(mean_saving[d])
        out.append(
            f"- {d} (the default): mean saving {100 * np.mean(mean_saving[d]):.1f}% over the "
            f"shared sets (target >= 40%), worst set {100 * worst_set:.1f}% (target >= 0)"
        )
    if mean_saving.get("opt_kg") and mean_saving.get(d):
        out.append(
            f"- {d} against opt_kg: mean saving {100 * np.mean(mean_saving[d]):.1f}% vs "
            f"{100 * np.mean(mean_saving['opt_kg']):.1f}%"
        )
        gaps = [
            100 * (np.mean([c.at(b * targets[n].answers) for c in curves[n][d]])
                   - np.mean([c.at(b * targets[n].answers) for c in curves[n]["opt_kg"]]))
            for n in real if "opt_kg" in curves[n] for b in BUDGETS
        ]  # fmt: skip
        out.append(
            f"- {d} minus opt_kg in accuracy at the fixed budgets, worst over sets and budgets: "
            f"{min(gaps):+.2f} points (target >= -2)"
        )
    for n in curves:
        if "oracle" in curves[n] and d in curves[n]:
            half = 0.5 * targets[n].answers
            gap = 100 * (np.mean([c.at(half) for c in curves[n][d]])
                         - np.mean([c.at(half) for c in curves[n]["oracle"]]))  # fmt: skip
            out.append(f"- {n}: {d} minus oracle at 50% of the answers: {gap:+.2f} points "
                       "(target >= -1)")  # fmt: skip
    return out


def mean_curves(curves: Curves) -> dict[str, dict[str, Curve]]:
    """Mean over campaigns (their checkpoints fall at the same label counts)."""
    out: dict[str, dict[str, Curve]] = {}
    for name, by_policy in curves.items():
        out[name] = {}
        for pol, per_seed in by_policy.items():
            m = min(len(cv.labels) for cv in per_seed)
            acc = np.mean([cv.accuracy[:m] for cv in per_seed], axis=0)
            out[name][pol] = Curve(per_seed[0].labels[:m], acc.tolist())
    return out


def plot(results: dict[str, dict[str, Curve]], targets: dict[str, Target], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    cols = min(4, len(names))
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    for ax, name in zip(axes.ravel(), names, strict=False):
        t = targets[name].accuracy
        for pol, curve in results[name].items():
            style = "--" if POLICIES[pol].redundancy is not None else "-"
            ax.plot(curve.labels, 100 * np.asarray(curve.accuracy), style, label=pol, lw=1.2)
        ax.axhline(100 * t, color="k", lw=0.8, ls="--")
        ax.axhspan(100 * (t - TOLERANCE), 100 * t, color="0.85")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("labels bought")
        ax.set_ylabel("accuracy on gold (%)")
        lo = min(min(c.accuracy) for c in results[name].values())
        ax.set_ylim(100 * max(lo, t - 0.15), 100 * t + 3)
    for ax in axes.ravel()[len(names) :]:
        ax.axis("off")
    axes.ravel()[0].legend(fontsize=7, loc="lower right")
    fig.suptitle(
        "Replay of the crowds' answers: accuracy (what a refit on the answers bought serves) "
        "against labels bought, mean of the campaigns; dashed black: batch EM on all answers "
        "(grey: within 0.5 point)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_csv(curves: Curves, path: Path) -> None:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["dataset", "policy", "seed", "labels", "accuracy"])
        for name, by_policy in curves.items():
            for p, per_seed in by_policy.items():
                for s, cv in enumerate(per_seed):
                    w.writerows(
                        [name, p, s, n, a] for n, a in zip(cv.labels, cv.accuracy, strict=True)
                    )


def read_csv(path: Path) -> Curves:
    curves: dict[str, dict[str, dict[int, Curve]]] = {}
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            by_seed = curves.setdefault(row["dataset"], {}).setdefault(row["policy"], {})
            cv = by_seed.setdefault(int(row["seed"]), Curve())
            cv.labels.append(int(row["labels"]))
            cv.accuracy.append(float(row["accuracy"]))
    return {n: {p: list(s.values()) for p, s in d.items()} for n, d in curves.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    synth = ",".join(f"syn_{r}" for r in ("sparse", "spammers", "difficulty", "many_classes"))
    parser.add_argument("--datasets", default=",".join(dataset_names()) + "," + synth,
                        help=f"shared datasets and syn_<regime> ({', '.join(SYNTHETIC)})")  # fmt: skip
    parser.add_argument("--policies", default=DEFAULT_POLICIES,
                        help=f"of {', '.join(POLICIES)}")  # fmt: skip
    parser.add_argument("--seeds", type=int, default=10, help="campaigns per dataset")
    parser.add_argument("--step", type=float, default=0.02, help="items picked per step (fraction)")
    parser.add_argument("--checkpoint", type=float, default=0.025,
                        help="answers between measurements (fraction of all answers)")  # fmt: skip
    parser.add_argument("--refresh", type=int, default=10, help="steps between refine sweeps")
    parser.add_argument("--jobs", type=int, default=2, help="processes")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--from-csv", type=Path, nargs="+", default=None,
                        help="only tabulate and plot the curves of earlier runs")  # fmt: skip
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.from_csv is not None:
        curves: Curves = {}
        for path in args.from_csv:  # runs of other policies on the same sets add up
            for name, by_policy in read_csv(path).items():
                curves.setdefault(name, {}).update(by_policy)
        header = "from " + ", ".join(str(p) for p in args.from_csv)
    else:
        names, policies = args.datasets.split(","), args.policies.split(",")
        unknown = [p for p in policies if p not in POLICIES]
        if unknown:
            parser.error(f"unknown policies {unknown}; expected some of {list(POLICIES)}")
        curves = run(names, policies, args.seeds, args.step, args.checkpoint, args.refresh,
                     args.jobs)  # fmt: skip
        write_csv(curves, args.out / "active.csv")
        if "uniform" not in policies:  # the savings are counted against it: tabulate later
            print(f"wrote {args.out}/active.csv; tabulate it with --from-csv beside a run "
                  "with uniform")  # fmt: skip
            return
        header = (
            f"`python -m bench.active --seeds {args.seeds}`: {args.seeds} campaigns per set; "
            f"step {args.step:.0%} of the items, checkpoint (batch EM) every {args.checkpoint:.0%} "
            "of the answers"
        )
    targets = {}
    for name in curves:
        crowd = _crowd(name)
        targets[name] = Target(full_data_target(crowd), crowd.n_answers, crowd.n_items)
    text = report(curves, targets, header)
    print(text)
    (args.out / "active.md").write_text(text + "\n")
    plot(mean_curves(curves), targets, args.out / "active.png")
    print(f"wrote {args.out}/active.png, active.csv, active.md")


if __name__ == "__main__":
    main()
