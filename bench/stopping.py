"""Does the stopping rule keep its word? ``python -m bench.stopping``.

The queue calls an item done when its posterior reaches ``target_confidence``. This replays
that on the shared datasets: every round, each item not yet done receives its next answer
(its real answers, revealed one at a time in a random order, with the worker who gave them),
the online model learns the arrival as the service's engine does, and an item stops the
first time its posterior reaches the target. Reported per dataset: how many items stopped,
how often the stopped items are right (the promise is: at least the target), their mean
confidence, and the share of the campaign's answers bought. Once with the posteriors the
service serves (calibrated, docs/model.md eq. 21-25), once with the model's own.

``--gold-fraction 0.05``: that share of items (at most ``--gold-max``) are honeypots: all
their answers come first, with their gold known to the model; they are never queued and not
scored, and they calibrate the others (docs/model.md eq. 24).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from bench.crowds import Crowd, load_shared
from bench.datasets import DEFAULT_ROOT, dataset_names
from core.blocks import LabelBlocks
from core.hashing import worker_slots
from core.nominal import NominalConfig
from core.online import BlockResult, OnlineEM
from core.served import calibration

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Stopped:
    n_items: int
    """Items scored (with truth, not given as gold)."""
    n_stopped: int
    accuracy: float
    """Share of the stopped items whose label is right (NaN when none stopped)."""
    confidence: float
    """Their mean confidence when they stopped."""
    answers_used: float
    """Share of the campaign's answers revealed."""


def replay(crowd: Crowd, target: float, seed: int, served: bool, gold: I64) -> Stopped:
    """One campaign: answers revealed round by round until each item reaches ``target``."""
    config = NominalConfig(n_classes=crowd.n_classes, n_items=float(crowd.n_items))
    slots = worker_slots(crowd.worker_ids(), config.n_worker_slots)[crowd.worker]
    rng = np.random.default_rng(seed)
    shuffled = rng.permutation(crowd.n_answers)  # each item's answers in a random order
    by_item = shuffled[np.argsort(crowd.item[shuffled], kind="stable")]
    sizes = np.bincount(crowd.item, minlength=crowd.n_items)
    start = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    rank = np.empty(crowd.n_answers, dtype=np.int64)
    rank[by_item] = np.arange(crowd.n_answers) - np.repeat(start, sizes)
    model, K = OnlineEM(config), crowd.n_classes
    q, b = np.full((crowd.n_items, K), 1.0 / K), np.zeros(crowd.n_items)
    done = gold >= 0  # honeypots are never queued: all their answers come first
    honeypots = np.flatnonzero(done)
    pots = _first_answers(crowd, slots, rank, honeypots, int(sizes.max(initial=0)))
    model.learn_many(pots, known=gold[honeypots])
    stop_q = np.full((crowd.n_items, K), np.nan)
    revealed = np.zeros(crowd.n_items, dtype=np.int64)
    for r in range(int(sizes.max(initial=0))):
        active = np.flatnonzero(~done & (sizes > r))
        if not active.size:
            break
        blocks = _first_answers(crowd, slots, rank, active, r + 1)
        previous = BlockResult(q[active], b[active], np.zeros(active.size))
        res = model.learn_many(
            blocks, previous=previous, n_previous=np.full(active.size, r), known=gold[active]
        )
        q[active], b[active], revealed[active] = res.posteriors, res.clarity, r + 1
        shown = res.posteriors
        if served:
            shown = calibration(
                model.params, pots, model.params.evidence, gold[honeypots]
            ).from_posteriors(res.posteriors, np.full(active.size, float(r + 1)))
        now = shown.max(axis=1) >= target
        stop_q[active[now]] = shown[now]
        done[active[now]] = True
    scored = (crowd.gold >= 0) & (gold < 0)
    stopped = scored & ~np.isnan(stop_q[:, 0])
    right = stop_q[stopped].argmax(axis=1) == crowd.gold[stopped]
    return Stopped(
        int(scored.sum()),
        int(stopped.sum()),
        float(right.mean()) if right.size else float("nan"),
        float(stop_q[stopped].max(axis=1).mean()) if right.size else float("nan"),
        float(revealed.sum() / max(crowd.n_answers, 1)),
    )


def _first_answers(crowd: Crowd, slots: I64, rank: I64, items: I64, n: int) -> LabelBlocks:
    """One block per item of ``items``: its first ``n`` answers in the order revealed (the
    earlier ones first, as the engine keeps them)."""
    pick = np.zeros(crowd.n_items, dtype=bool)
    pick[items] = True
    sel = np.flatnonzero(pick[crowd.item] & (rank < n))
    code = np.full(crowd.n_items, -1, dtype=np.int64)
    code[items] = np.arange(items.size)
    sel = sel[np.lexsort((rank[sel], code[crowd.item[sel]]))]
    counts = np.bincount(code[crowd.item[sel]], minlength=items.size)
    ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return LabelBlocks(ptr, slots[sel], crowd.label[sel], np.ones(sel.size))


def gold_given(crowd: Crowd, fraction: float, most: int, seed: int) -> I64:
    """Gold handed to the model: ``fraction`` of the items (at most ``most``) with truth."""
    out = np.full(crowd.n_items, -1, dtype=np.int64)
    if fraction <= 0:
        return out
    has = np.flatnonzero(crowd.gold >= 0)
    k = min(most, round(fraction * crowd.n_items), has.size)
    pick = np.random.default_rng(seed + 1000).choice(has, k, replace=False)
    out[pick] = crowd.gold[pick]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.stopping", description=(__doc__ or "").splitlines()[0]
    )
    ap.add_argument("--datasets", default=None, help="comma-separated (default: all shared)")
    ap.add_argument("--target", type=float, default=0.9, help="target_confidence")
    ap.add_argument("--seeds", type=int, default=3, help="random campaigns per dataset")
    ap.add_argument("--gold-fraction", type=float, default=0.0)
    ap.add_argument("--gold-max", type=int, default=50)
    ap.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    names = args.datasets.split(",") if args.datasets else dataset_names(args.root)
    print(
        f"# stopping at target_confidence {args.target}: items stopped, share of them right "
        f"(promise: >= {args.target}), mean confidence at stop, answers bought; mean of "
        f"{args.seeds} campaigns; gold given on {args.gold_fraction:.0%} of items "
        f"(at most {args.gold_max})"
    )
    print(
        f"{'dataset':<20}{'posterior':>10}{'stopped':>9}{'right %':>9}{'conf %':>8}{'bought %':>10}"
    )
    kept: dict[bool, list[tuple[str, float, float]]] = {True: [], False: []}
    for name in names:
        crowd = load_shared(name, args.root)
        for served in (True, False):
            runs = [
                replay(crowd, args.target, s, served,
                       gold_given(crowd, args.gold_fraction, args.gold_max, s))
                for s in range(args.seeds)
            ]  # fmt: skip
            acc = float(np.nanmean([x.accuracy for x in runs]))
            n = float(np.mean([x.n_stopped for x in runs]))
            print(
                f"{name:<20}{'served' if served else 'raw':>10}{n:>9.0f}{100 * acc:>9.2f}"
                f"{100 * np.nanmean([x.confidence for x in runs]):>8.2f}"
                f"{100 * np.mean([x.answers_used for x in runs]):>10.1f}",
                flush=True,
            )
            kept[served].append((name, acc, n))
    for served in (True, False):
        ok = [a >= args.target - 0.01 for _, a, n in kept[served] if n >= 20]
        bad = [nm for nm, a, n in kept[served] if n >= 20 and a < args.target - 0.01]
        print(
            f"{'served' if served else 'raw':>6}: stopped items right >= {args.target - 0.01:.2f} "
            f"on {sum(ok)} of {len(ok)} datasets where >= 20 items stopped"
            + (f" (not on {', '.join(bad)})" if bad else "")
        )
    print(f"wall time {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
