"""Grid search over the online model's defaults: ``python -m bench.grid``.

For each configuration: online EM, one pass over every shared dataset in random order, accuracy on
gold under the final parameters (as ``bench.run``'s "online 1" column), mean over 5 orders. The
configurations are printed ranked by the mean over the datasets, with the worst per-dataset
margin over majority vote (the default must stay >= majority vote on every set).

    python -m bench.grid --vary eta0=10,30,100 --vary tau0=30,100,300
    python -m bench.grid --fix eta0=20 --neighbours eta0,tau0,rho,population_rate,class_rate

``--vary name=v1,v2,...`` (repeatable) evaluates the Cartesian product over the defaults, with
``--fix name=v`` applied to every configuration. ``--neighbours a,b,...`` evaluates the centre
(defaults + ``--fix``) and, for each named parameter, the centre with that parameter divided and
multiplied by ``--factor`` (default 1.5; ``rho`` moves by +-0.05 and ``population_diagonal``
by +-0.5 instead): the flatness check. Parameters are NominalConfig fields (eta0, tau0, rho,
population_rate, class_rate, worker_prior, population_prior, population_diagonal,
class_prior_strength) and ``n_items``, given as a multiple of each dataset's item count (the
benchmarks use 1: the number of items in the file, as ``crowdtally extract`` does; the
``NominalConfig`` default 10,000 only applies where the item count is unknown).
``--passes N`` evaluates N passes instead (later passes as in ``bench.run``: Newton sweeps).
``--synthetic`` adds tests/conftest.py's synthetic set (3,000 items, 3 classes; one pass, mean
over the same orders) as an extra column that does not enter the ranking.

Datasets are loaded and majority vote computed once; everything runs in this process on one core.
"""

from __future__ import annotations

import argparse
import itertools
import time
from dataclasses import dataclass, fields

import numpy as np

from bench.datasets import dataset_names
from bench.run import ORDERS, Prepared, acc, online_accuracy, prepare
from core.batch import majority_vote
from core.blocks import LabelBlocks
from core.nominal import NominalConfig
from core.online import OnlineEM

TUNABLE = {f.name for f in fields(NominalConfig)} - {
    "n_classes",
    "n_worker_slots",
    "class_prior",
    "difficulty",
    "em_tol",
    "em_max_iter",
}
ADDITIVE_STEP = {"rho": 0.05, "population_diagonal": 0.5}
Setting = dict[str, float]


@dataclass(frozen=True)
class Row:
    setting: Setting
    means: np.ndarray  # per dataset, mean over the orders
    synthetic: float | None

    def margins(self, mv: np.ndarray) -> np.ndarray:
        return np.asarray(self.means - mv)


def configure(p: Prepared, setting: Setting) -> Prepared:
    changes = {k: v for k, v in setting.items() if k != "n_items"}
    changes["n_items"] = setting.get("n_items", 1.0) * p.data.n_items
    return Prepared(p.data, p.gold, p.hashed, p.exact, p.config.with_(**changes))


def synthetic_accuracy(setting: Setting, orders: int) -> float:
    from tests.conftest import dawid_skene

    syn = dawid_skene(n_items=3000, n_workers=40, per_item=5, n_classes=3, seed=7)
    changes = {k: v for k, v in setting.items() if k != "n_items"}
    config = NominalConfig(n_classes=3, n_items=3000.0 * setting.get("n_items", 1.0)).with_(
        **changes
    )
    blocks = LabelBlocks.group(syn.items, syn.workers, syn.labels)
    runs = []
    for seed in range(orders):
        model = OnlineEM(config)
        model.learn_many(blocks, order=np.random.default_rng(seed).permutation(blocks.n_blocks))
        runs.append(np.mean(model.predict_many(blocks).posteriors.argmax(1) == syn.truth))
    return float(np.mean(runs))


def evaluate(
    data: list[Prepared], setting: Setting, passes: int, orders: int, synthetic: bool
) -> Row:
    means = np.array(
        [
            np.mean([online_accuracy(configure(p, setting), passes, s) for s in range(orders)])
            for p in data
        ]
    )
    return Row(setting, means, synthetic_accuracy(setting, orders) if synthetic else None)


def parse_values(spec: str) -> tuple[str, list[float]]:
    name, _, values = spec.partition("=")
    if name not in TUNABLE:
        raise SystemExit(f"unknown parameter {name!r}; tunable: {sorted(TUNABLE)}")
    return name, [float(v) for v in values.split(",")]


def neighbours(centre: Setting, names: list[str], factor: float) -> list[Setting]:
    defaults = NominalConfig(n_classes=2)
    out = [dict(centre)]
    for name in names:
        value = centre.get(name, 1.0 if name == "n_items" else getattr(defaults, name))
        if name in ADDITIVE_STEP:
            moved = [value - ADDITIVE_STEP[name], value + ADDITIVE_STEP[name]]
        else:
            moved = [value / factor, value * factor]
        out += [centre | {name: round(v, 6)} for v in moved]
    return out


def label(setting: Setting) -> str:
    return " ".join(f"{k}={v:g}" for k, v in sorted(setting.items())) or "(defaults)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vary", action="append", default=[], metavar="NAME=V1,V2,...")
    parser.add_argument("--fix", action="append", default=[], metavar="NAME=V")
    parser.add_argument("--neighbours", default="", metavar="NAME,NAME,...")
    parser.add_argument("--factor", type=float, default=1.5)
    parser.add_argument("--passes", type=int, default=1)
    parser.add_argument("--orders", type=int, default=ORDERS)
    parser.add_argument("--datasets", default=",".join(dataset_names()))
    parser.add_argument("--synthetic", action="store_true", help="add the tests' synthetic set")
    parser.add_argument("--per-dataset", action="store_true", help="print every dataset's margin")
    parser.add_argument("--top", type=int, default=0, help="print only the best N (0: all)")
    args = parser.parse_args()

    fixed: Setting = {}
    for spec in args.fix:
        name, values = parse_values(spec)
        fixed[name] = values[0]
    if args.neighbours:
        settings = neighbours(fixed, args.neighbours.split(","), args.factor)
    else:
        grid = [parse_values(spec) for spec in args.vary]
        settings = [
            fixed | dict(zip([n for n, _ in grid], combo, strict=True))
            for combo in itertools.product(*[v for _, v in grid])
        ]

    names = args.datasets.split(",")
    data = [prepare(name) for name in names]
    mv = np.array([acc(majority_vote(p.exact, p.config.n_classes).probas, p.gold) for p in data])
    print(
        f"{len(settings)} configurations x {len(names)} datasets x {args.orders} orders, "
        f"{args.passes} pass(es); majority vote mean {100 * mv.mean():.2f}",
        flush=True,
    )
    rows = []
    t0 = time.perf_counter()
    for setting in settings:
        row = evaluate(data, setting, args.passes, args.orders, args.synthetic)
        rows.append(row)
        worst = int(np.argmin(row.margins(mv)))
        print(
            f"  {100 * row.means.mean():6.2f}  worst {100 * row.margins(mv)[worst]:+6.2f} "
            f"({names[worst]})  {label(setting)}  [{time.perf_counter() - t0:.0f}s]",
            flush=True,
        )

    ranked = sorted(rows, key=lambda r: -r.means.mean())
    if args.top:
        ranked = ranked[: args.top]
    print("\nranked by mean one-pass accuracy (%); worst = min over datasets of (online - MV)")
    head = f"{'mean':>7} {'worst':>7} {'below':>5}"
    if args.synthetic:
        head += f" {'synth':>6}"
    if args.per_dataset:
        head += "".join(f" {n[:6]:>6}" for n in names)
    print(head + "  configuration")
    for row in ranked:
        m = row.margins(mv)
        line = f"{100 * row.means.mean():7.2f} {100 * m.min():+7.2f} {int(np.sum(m < 0)):5d}"
        if row.synthetic is not None:
            line += f" {100 * row.synthetic:6.2f}"
        if args.per_dataset:
            line += "".join(f" {100 * v:+6.2f}" for v in m)
        print(line + "  " + label(row.setting))


if __name__ == "__main__":
    main()
