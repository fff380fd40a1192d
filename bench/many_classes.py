"""Crowds of many classes and few items a class: ``python -m bench.many_classes``.

200 items of 15 answers from 40 workers, each answer right with probability ``--right`` and
otherwise a class drawn uniformly; K classes, so each row of the population matrix learns from
about 200/K items. Majority vote is right on (nearly) every item; the model must not do worse.
Reported for majority vote, one online pass, one pass and ``--sweeps`` idle sweeps (what the
service serves once a project is idle) and batch EM, at ``--slots`` hashed worker slots (the
service's ``worker_slots``, small enough for 256 classes to fit in memory), and, with
``--population-prior``, at other values of the population's prior (docs/model.md,
"Parameters": the precision is that times K/2).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from bench.crowds import Crowd
from bench.quality import I64, accuracy, ece, nominal_config, run_batch, run_online, vote_shares
from core.nominal import NominalConfig


def many_class_crowd(n_classes: int, right: float, seed: int = 0) -> Crowd:
    """200 items x 15 answers from 40 workers, each answer right with probability ``right``."""
    rng = np.random.default_rng(seed)
    n_items, n_workers, per = 200, 40, 15
    truth = rng.integers(0, n_classes, n_items)
    item = np.repeat(np.arange(n_items), per)
    worker = np.concatenate([rng.choice(n_workers, per, replace=False) for _ in range(n_items)])
    label = np.where(
        rng.random(item.size) < right, truth[item], rng.integers(0, n_classes, item.size)
    )
    classes = tuple(f"c{k}" for k in range(n_classes))
    return Crowd(f"K{n_classes}", "", item, worker, label, n_items, n_workers, classes, truth)


def rows(crowd: Crowd, config: NominalConfig, sweeps: int) -> list[tuple[str, float, float]]:
    """(method, accuracy %, ECE points) on every item."""
    none: I64 = np.full(crowd.n_items, -1)
    fits = [
        ("majority vote", vote_shares(crowd)),
        ("online, one pass", run_online(crowd, none, 0, config)),
        (f"online, {sweeps} idle sweeps", run_online(crowd, none, 0, config, idle_passes=sweeps)),
        ("batch EM", run_batch(crowd, none, config)),
    ]
    return [(name, 100 * accuracy(q, crowd.gold), ece(q, crowd.gold)) for name, q in fits]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--classes", default="16,64,256", help="comma-separated K")
    ap.add_argument("--right", type=float, default=0.7, help="chance an answer is right")
    ap.add_argument("--slots", type=int, default=64, help="hashed worker slots")
    ap.add_argument("--sweeps", type=int, default=1, help="idle sweeps after the pass")
    ap.add_argument("--population-prior", default="", help="comma-separated values to try")
    args = ap.parse_args(argv)
    print(f"{'K':>4}  {'population_prior':>16}  {'method':<24}  {'acc %':>6}  {'ECE':>6}")
    for k in (int(x) for x in args.classes.split(",")):
        crowd = many_class_crowd(k, args.right)
        base = nominal_config(crowd, n_worker_slots=args.slots)
        priors = [float(x) for x in args.population_prior.split(",") if x] or [
            base.population_prior
        ]
        for prior in priors:
            config = replace(base, population_prior=prior)
            for name, acc, err in rows(crowd, config, args.sweeps):
                print(f"{k:>4}  {prior:>16g}  {name:<24}  {acc:>6.2f}  {err:>6.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
