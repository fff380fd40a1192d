"""Replay bench for active label acquisition: ``python -m bench.active``.

On every shared dataset with at least 5 answers per item (on average), simulate a campaign
from the real answers: each item starts with one of its real answers (chosen at random);
at each step a policy picks a batch of items (``--step`` of the items, at least one) and each
picked item reveals one more of *its own* real answers (a policy may choose which of the
workers who really answered it; otherwise the next one in a random order fixed per seed).
An item whose real answers are all revealed is finished. Every policy sees the same random
answer orders (common random numbers).

Posteriors that drive the policies come from the project's own models, as the service would
have them: ``OnlineEM.learn_many`` on each arrival (``previous``/``n_previous`` as in
``app/engine/project.py``), a ``revisit_many`` pass over every item every ``--refresh`` steps, and a
batch EM refit at every checkpoint (``--checkpoint`` of the answers), mapped into the hashed
slots like the engine's ``refit`` entry. Accuracy at a checkpoint is that refit's (batch EM on
the revealed answers, exact workers) on the gold items. The yardstick is batch EM on *all*
the answers; "labels needed" is the first checkpoint whose accuracy is within 0.5 point of it
(all the answers when none is), counting every label including each item's first.

Policies: uniform (round robin: fewest revealed first), entropy and margin (the uncertainty
policies, docs/active.md eq. A2, A3), voi (value of information under the population
confusion, eq. A5, with a two-label look-ahead to break its ties), voi_worker (the item and
real worker with the largest VOI under that worker's own confusion); least_confident and
entropy_worker are registered but not run by default; and a slot for hmin (register it in
``POLICIES`` once the dyadic model provides its score).

Writes bench/out/active.png (accuracy against labels used), active.csv (the curves) and
active.md (the table it prints).
"""

from __future__ import annotations

import argparse
import csv
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from app.io.extract import Encoded, load_labelled
from bench.datasets import DEFAULT_ROOT, dataset_names
from core import acquisition as acq
from core.batch import BatchEM, into_slots
from core.blocks import FloatArray, IntArray, LabelBlocks
from core.dyadic import DyadicConfig, DyadicModel
from core.hashing import worker_slots
from core.nominal import NominalConfig
from core.online import BlockResult, OnlineEM, statistics_from

OUT = Path(__file__).resolve().parent / "out"
TOLERANCE = 0.005  # "within 0.5 point" of full-data batch EM


@dataclass
class Campaign:
    """One replay: the real answers in a fixed random order per item, a revealed prefix each."""

    data: Encoded
    gold: IntArray
    config: NominalConfig
    slots: IntArray  # hashed slot per worker code
    order: IntArray  # answer indices grouped by item, random order inside an item
    start: IntArray  # order[start[i]:start[i+1]] are item i's answers
    revealed: IntArray  # how many of item i's answers are revealed (a prefix of its order)
    rng: np.random.Generator
    tiebreak: FloatArray  # a fixed random priority per item, for ties
    model: OnlineEM = field(init=False)
    q: FloatArray = field(init=False)
    learned: IntArray = field(init=False)

    @classmethod
    def start_from(cls, data: Encoded, gold: IntArray, seed: int) -> Campaign:
        rng = np.random.default_rng(seed)
        perm = rng.permutation(data.items.size)
        order = perm[np.argsort(data.items[perm], kind="stable")]
        counts = np.bincount(data.items, minlength=data.n_items)
        start = np.zeros(data.n_items + 1, dtype=np.int64)
        np.cumsum(counts, out=start[1:])
        config = NominalConfig(n_classes=len(data.classes), n_items=float(data.n_items))
        slots = worker_slots(data.worker_ids.tolist(), config.n_worker_slots)
        c = cls(
            data, gold, config, slots, order, start,
            np.minimum(counts, 1).astype(np.int64), rng, rng.random(data.n_items),
        )  # fmt: skip
        c.model = OnlineEM(config)
        c.learned = np.zeros(data.n_items, dtype=np.int64)
        c.q = np.full((data.n_items, config.n_classes), 1.0 / config.n_classes)
        c.learn(rng.permutation(data.n_items))
        return c

    # -- bookkeeping --------------------------------------------------------------------
    @property
    def counts(self) -> IntArray:
        out: IntArray = np.diff(self.start)
        return out

    @property
    def labels_used(self) -> int:
        return int(self.revealed.sum())

    def answers_of(self, items: IntArray) -> tuple[IntArray, IntArray]:
        """Revealed answer indices of ``items`` (their prefixes, in order) and block ptr."""
        n = self.revealed[items]
        ptr = np.zeros(items.size + 1, dtype=np.int64)
        np.cumsum(n, out=ptr[1:])
        within = np.arange(ptr[-1]) - np.repeat(ptr[:-1], n)
        return self.order[np.repeat(self.start[items], n) + within], ptr

    def hashed_blocks(self, items: IntArray) -> LabelBlocks:
        """The items' revealed labels, earlier arrivals first (as the engine keeps them)."""
        idx, ptr = self.answers_of(items)
        d = self.data
        return LabelBlocks(ptr, self.slots[d.workers[idx]], d.labels[idx], d.weights[idx])

    # -- the model, as the engine runs it ----------------------------------------------
    def learn(self, items: IntArray) -> None:
        """New arrivals: learn_many with each item's previous posterior and label count."""
        blocks = self.hashed_blocks(items)
        previous = BlockResult(self.q[items], np.zeros(items.size), np.zeros(items.size))
        res = self.model.learn_many(blocks, previous=previous, n_previous=self.learned[items])
        self.q[items] = res.posteriors
        self.learned[items] = self.revealed[items]

    def revisit(self) -> None:
        items = np.arange(self.data.n_items, dtype=np.int64)
        blocks = self.hashed_blocks(items)
        previous = BlockResult(self.q.copy(), np.zeros(items.size), np.zeros(items.size))
        self.q = self.model.revisit_many(blocks, previous).posteriors.copy()

    def refit(self) -> float:
        """Batch EM on the revealed answers (exact workers): its accuracy on gold; its
        parameters, mapped into the hashed slots, replace the online model's (engine refit)."""
        d, cfg = self.data, self.config
        idx, _ = self.answers_of(np.arange(d.n_items, dtype=np.int64))
        exact = LabelBlocks.group(d.items[idx], d.workers[idx], d.labels[idx], d.weights[idx],
                                  n_blocks=d.n_items)  # fmt: skip
        nw = d.worker_ids.size
        fitted, params = BatchEM(cfg).fit(exact, nw)
        n_labels = np.bincount(d.workers[idx], minlength=nw).astype(np.float64)
        step = float(self.model.params.scalars[1])
        mapped = into_slots(params, self.slots, n_labels, cfg.n_worker_slots, step)
        statistics_from(mapped, self.hashed_blocks(np.arange(d.n_items)), fitted.probas)
        self.model.params = mapped
        self.q = fitted.probas.copy()
        self.learned = self.revealed.copy()
        has = self.gold >= 0
        return float(np.mean(fitted.labels[has] == self.gold[has]))

    # -- revealing ---------------------------------------------------------------------
    def reveal(self, items: IntArray, answer: IntArray | None = None) -> None:
        """Reveal one more real answer of each item: the next in its order, or the given
        answer index (one of its unrevealed answers), which is swapped to the front."""
        if answer is not None:
            for i, a in zip(items.tolist(), answer.tolist(), strict=True):
                head = self.start[i] + self.revealed[i]
                at = self.start[i] + int(
                    np.flatnonzero(self.order[self.start[i] : self.start[i + 1]] == a)[0]
                )
                if at < head:
                    raise ValueError("that answer is already revealed")
                self.order[head], self.order[at] = self.order[at], self.order[head]
        if np.any(self.revealed[items] >= self.counts[items]):
            raise ValueError("an item has no real answer left")
        self.revealed[items] += 1
        self.learn(items)

    def remaining_answers(self) -> tuple[IntArray, IntArray]:
        """Every unrevealed answer index and its item."""
        n = self.counts - self.revealed
        ptr = np.zeros(n.size + 1, dtype=np.int64)
        np.cumsum(n, out=ptr[1:])
        within = np.arange(ptr[-1]) - np.repeat(ptr[:-1], n)
        items = np.repeat(np.arange(n.size), n)
        return self.order[self.start[items] + self.revealed[items] + within], items


# A policy returns the items to reveal next (and optionally which of their real answers).
Policy = Callable[[Campaign, int], tuple[IntArray, IntArray | None]]


def _pick(c: Campaign, scores: FloatArray, n: int) -> IntArray:
    """The n best-scoring items that still have a real answer to reveal (the bench spends
    every answer, so no stopping rule beyond that)."""
    return acq.select(scores, c.revealed >= c.counts, limit=n)


def uniform(c: Campaign, n: int) -> tuple[IntArray, IntArray | None]:
    """Round robin: the items with the fewest revealed answers (random order among ties)."""
    return _pick(c, -c.revealed + 0.5 * c.tiebreak, n), None


def uncertainty(c: Campaign, n: int) -> tuple[IntArray, IntArray | None]:
    """Largest posterior entropy (eq. A2)."""
    return _pick(c, acq.entropy(c.q) + 1e-9 * c.tiebreak, n), None


def least_confident(c: Campaign, n: int) -> tuple[IntArray, IntArray | None]:
    """Largest chance that the most likely label is wrong (eq. A1)."""
    return _pick(c, acq.error_probability(c.q) + 1e-9 * c.tiebreak, n), None


def smallest_margin(c: Campaign, n: int) -> tuple[IntArray, IntArray | None]:
    """Smallest lead of the best class over the runner-up (eq. A3)."""
    return _pick(c, -acq.margin(c.q) + 1e-9 * c.tiebreak, n), None


def voi(c: Campaign, n: int) -> tuple[IntArray, IntArray | None]:
    """Value of information of one label from a typical worker (eq. A5); ties (often all
    zero: one label cannot flip the argmax) broken by two-label VOI (A6), then entropy."""
    C = c.model.params.population_confusion()
    one = acq.value_of_information(c.q, C)
    two = acq.value_of_information(c.q, C, lookahead=2)
    return _pick(c, one + 1e-3 * two + 1e-6 * acq.entropy(c.q), n), None


def _pair_scores(c: Campaign, answers: IntArray, items: IntArray) -> FloatArray:
    """VOI of each unrevealed real answer (item, worker) under that worker's own confusion
    (eq. A5), its two-label look-ahead (A6) and the item's entropy breaking ties."""
    slots, which = np.unique(c.slots[c.data.workers[answers]], return_inverse=True)
    conf = c.model.params.worker_confusion(slots)
    q = c.q[items]
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
    best = np.full(c.data.n_items, -np.inf)
    np.maximum.at(best, items, pair)
    picked = _pick(c, best, n)
    return picked, _best_answer_of(items, answers, pair, picked)


def uncertainty_worker(c: Campaign, n: int) -> tuple[IntArray, IntArray | None]:
    """Items by entropy (as ``uncertainty``); each reveals the answer of its remaining real
    worker with the largest per-worker VOI."""
    picked, _ = uncertainty(c, n)
    answers, items = c.remaining_answers()
    mine = np.isin(items, picked)
    answers, items = answers[mine], items[mine]
    return picked, _best_answer_of(items, answers, _pair_scores(c, answers, items), picked)


def hmin(c: Campaign, n: int) -> tuple[IntArray, IntArray | None]:
    """Near the boundary (issue 5's h_min): a dyadic model (core.dyadic, k=2, hinge, l2 0.2)
    learns every revealed (worker, item, answer); for every unrevealed real (item, worker)
    pair, h_min is the smallest importance weight that would flip the label the model
    predicts that worker gives that item. Items are ranked by their smallest h_min (the
    answer the model is least sure of), and that worker's answer is revealed."""
    d = c.data
    model: DyadicModel | None = getattr(c, "_dyadic", None)
    if model is None:
        cfg = DyadicConfig(n_classes=c.config.n_classes, k=2, l2=0.2, dyadic_rate=1.0,
                           rater_slots=max(1, d.worker_ids.size), task_slots=max(1, d.n_items))  # fmt: skip
        model = DyadicModel(cfg)
        c._dyadic = model  # type: ignore[attr-defined]
        c._dyadic_seen = np.zeros(d.n_items, dtype=np.int64)  # type: ignore[attr-defined]
    seen: IntArray = c._dyadic_seen  # type: ignore[attr-defined]
    new = np.flatnonzero(c.revealed > seen)
    if new.size:  # train on the answers revealed since the last call, in order
        take = np.concatenate(
            [c.order[c.start[i] + seen[i] : c.start[i] + c.revealed[i]] for i in new.tolist()]
        )
        model.learn_many(d.workers[take], d.items[take], d.labels[take], d.weights[take])
        seen[new] = c.revealed[new]
    answers, items = c.remaining_answers()
    h = model.h_min(d.workers[answers], items)
    h = np.where(np.isfinite(h), h, 1e12)
    smallest = np.full(d.n_items, np.inf)
    np.minimum.at(smallest, items, h)
    picked = _pick(c, -smallest + 1e-9 * c.tiebreak, n)
    return picked, _best_answer_of(items, answers, -h, picked)


POLICIES: dict[str, Policy] = {
    "hmin": hmin,
    "uniform": uniform,
    "entropy": uncertainty,
    "margin": smallest_margin,
    "voi": voi,
    "voi_worker": voi_worker,
    "least_confident": least_confident,
    "entropy_worker": uncertainty_worker,
}


@dataclass
class Curve:
    labels: list[int] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)

    def needed(self, target: float, sustained: bool = False) -> int:
        """Labels at the first checkpoint within TOLERANCE of ``target`` (``sustained``: from
        which on every checkpoint is); all the answers when there is none."""
        ok = np.asarray(self.accuracy) >= target - TOLERANCE - 1e-12
        if sustained:
            ok = np.logical_and.accumulate(ok[::-1])[::-1]
        hit = np.flatnonzero(ok)
        return self.labels[int(hit[0])] if hit.size else self.labels[-1]


def replay(
    data: Encoded, gold: IntArray, policy: Policy, seed: int, step: float, checkpoint: float,
    refresh: int, stop_at: float | None = None,
) -> Curve:  # fmt: skip
    """One campaign; stops when every answer is revealed (or at ``stop_at`` accuracy)."""
    c = Campaign.start_from(data, gold, seed)
    total = data.items.size
    per_step = max(1, round(step * data.n_items))
    every = max(1, round(checkpoint * total))
    curve = Curve()
    next_check, steps = c.labels_used, 0
    while True:
        if c.labels_used >= next_check or c.labels_used == total:
            curve.labels.append(c.labels_used)
            curve.accuracy.append(c.refit())
            next_check = c.labels_used + every
            if c.labels_used == total or (stop_at is not None and curve.accuracy[-1] >= stop_at):
                return curve
        n = min(per_step, next_check - c.labels_used)
        items, answers = policy(c, n)
        if items.size == 0:  # nothing left that the rule allows: reveal the rest uniformly
            items, answers = uniform(c, n)
        c.reveal(items, answers)
        steps += 1
        if steps % refresh == 0:
            c.revisit()


def qualifying(names: list[str], min_answers: float) -> list[str]:
    out = []
    for name in names:
        data, _ = load_labelled(DEFAULT_ROOT / name)
        if data.items.size / data.n_items >= min_answers:
            out.append(name)
    return out


def plot(results: dict[str, dict[str, Curve]], targets: dict[str, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    cols = 4 if len(names) > 4 else len(names)
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    for ax, name in zip(axes.ravel(), names, strict=False):
        for pol, curve in results[name].items():
            (line,) = ax.plot(curve.labels, 100 * np.asarray(curve.accuracy), label=pol, lw=1.3)
            ax.axvline(curve.needed(targets[name]), color=line.get_color(), ls=":", lw=0.9)
        ax.axhline(100 * targets[name], color="k", lw=0.8, ls="--")
        ax.axhspan(100 * (targets[name] - TOLERANCE), 100 * targets[name], color="0.85")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("labels used")
        ax.set_ylabel("accuracy on gold (%)")
        lo = min(min(c.accuracy) for c in results[name].values())
        ax.set_ylim(100 * max(lo, targets[name] - 0.15), 100 * targets[name] + 3)
    for ax in axes.ravel()[len(names) :]:
        ax.axis("off")
    axes.ravel()[0].legend(fontsize=8, loc="lower right")
    fig.suptitle(
        "Replay of real answers: accuracy (batch EM on the revealed answers) against labels used; "
        "mean of the campaigns; dashed: batch EM on all answers; dotted: where that mean first "
        "comes within 0.5 point (grey)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def full_data_target(name: str) -> tuple[float, int, int]:
    """Batch EM on all the answers: accuracy on gold, number of answers, number of items."""
    data, gold = load_labelled(DEFAULT_ROOT / name)
    config = NominalConfig(n_classes=len(data.classes), n_items=float(data.n_items))
    exact = LabelBlocks.group(data.items, data.workers, data.labels, data.weights,
                              n_blocks=data.n_items)  # fmt: skip
    full = BatchEM(config).fit(exact, data.worker_ids.size)[0]
    has = gold >= 0
    return float(np.mean(full.labels[has] == gold[has])), int(data.items.size), data.n_items


def report(
    curves: dict[str, dict[str, list[Curve]]], targets: dict[str, tuple[float, int, int]],
    header: str,
) -> str:  # fmt: skip
    """The table: labels needed per policy (mean over campaigns), savings against uniform."""
    names = list(curves)
    policies = list(curves[names[0]])
    others = [p for p in policies if p != "uniform"]
    lines = [header, ""]
    for title, sustained in (("reached", False), ("stays", True)):
        lines += [
            f"labels needed ({title}: the first checkpoint "
            + ("after which every later one is" if sustained else "that is")
            + f" within {100 * TOLERANCE:.1f} point of full-data batch EM)",
            "",
            "| dataset | answers | items | target % | "
            + " | ".join(policies) + " | " + " | ".join(f"{p} saves" for p in others) + " |",
            "|---" * (4 + len(policies) + len(others)) + "|",
        ]  # fmt: skip
        savings: dict[str, list[float]] = {p: [] for p in others}
        for name in names:
            target, total, items = targets[name]
            need = {
                p: float(np.mean([cv.needed(target, sustained) for cv in curves[name][p]]))
                for p in policies
            }
            for p in others:
                savings[p].append(1.0 - need[p] / need["uniform"])
            lines.append(
                f"| {name} | {total} | {items} | {100 * target:.2f} | "
                + " | ".join(f"{need[p]:.0f}" for p in policies) + " | "
                + " | ".join(f"{100 * savings[p][-1]:.1f}%" for p in others) + " |"
            )  # fmt: skip
        lines.append(
            "| mean | | | |" + " |" * len(policies) + " "
            + " | ".join(f"{100 * np.mean(v):.1f}%" for v in savings.values()) + " |"
        )  # fmt: skip
        lines.append("")
        for p, v in savings.items():
            ok = bool(np.mean(v) >= 0.30 and min(v) >= 0)
            lines.append(
                f"- {p}: mean saving {100 * np.mean(v):.1f}%, worst {100 * min(v):.1f}%; "
                f"done-when (>= 30% on average, never more than uniform): {ok}"
            )
        lines.append("")
    return "\n".join(lines)


def mean_curves(curves: dict[str, dict[str, list[Curve]]]) -> dict[str, dict[str, Curve]]:
    """Mean over campaigns (their checkpoints fall at the same label counts)."""
    out: dict[str, dict[str, Curve]] = {}
    for name, by_policy in curves.items():
        out[name] = {}
        for pol, per_seed in by_policy.items():
            m = min(len(cv.labels) for cv in per_seed)
            acc = np.mean([cv.accuracy[:m] for cv in per_seed], axis=0)
            out[name][pol] = Curve(per_seed[0].labels[:m], acc.tolist())
    return out


def read_csv(path: Path) -> dict[str, dict[str, list[Curve]]]:
    curves: dict[str, dict[str, dict[int, Curve]]] = {}
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            by_seed = curves.setdefault(row["dataset"], {}).setdefault(row["policy"], {})
            cv = by_seed.setdefault(int(row["seed"]), Curve())
            cv.labels.append(int(row["labels"]))
            cv.accuracy.append(float(row["accuracy"]))
    return {n: {p: list(s.values()) for p, s in d.items()} for n, d in curves.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default=",".join(dataset_names()))
    parser.add_argument("--min-answers", type=float, default=5.0,
                        help="mean answers per item a dataset needs to qualify")  # fmt: skip
    parser.add_argument("--policies", default="uniform,entropy,margin,voi,voi_worker")
    parser.add_argument("--seeds", type=int, default=3, help="campaigns (answer orders) per set")
    parser.add_argument("--step", type=float, default=0.01, help="items picked per step (fraction)")
    parser.add_argument("--checkpoint", type=float, default=0.01,
                        help="answers between refits/measurements (fraction of all answers)")  # fmt: skip
    parser.add_argument("--refresh", type=int, default=5, help="steps between revisit passes")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--from-csv", type=Path, default=None,
                        help="only tabulate and plot the curves of an earlier run")  # fmt: skip
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    header = (
        f"replay of real answers, {args.seeds} campaigns per set; step {args.step:.0%} of items, "
        f"checkpoint (batch EM refit) every {args.checkpoint:.0%} of answers"
    )
    if args.from_csv is not None:
        curves = read_csv(args.from_csv)
        header = f"from {args.from_csv}"
    else:
        curves = {}
        rows_csv: list[list[object]] = []
        for name in qualifying(args.datasets.split(","), args.min_answers):
            data, gold = load_labelled(DEFAULT_ROOT / name)
            curves[name] = {}
            t0 = time.perf_counter()
            for pol in args.policies.split(","):
                curves[name][pol] = [
                    replay(data, gold, POLICIES[pol], s, args.step, args.checkpoint, args.refresh)
                    for s in range(args.seeds)
                ]
                for s, cv in enumerate(curves[name][pol]):
                    rows_csv += [
                        [name, pol, s, n, a] for n, a in zip(cv.labels, cv.accuracy, strict=True)
                    ]
            print(f"# {name}: {time.perf_counter() - t0:.1f}s", flush=True)
        with (args.out / "active.csv").open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["dataset", "policy", "seed", "labels", "accuracy"])
            w.writerows(rows_csv)
    targets = {name: full_data_target(name) for name in curves}
    text = report(curves, targets, header)
    print(text)
    (args.out / "active.md").write_text(text + "\n")
    plot(mean_curves(curves), {n: t[0] for n, t in targets.items()}, args.out / "active.png")
    print(f"wrote {args.out}/active.png, active.csv, active.md")


if __name__ == "__main__":
    main()
