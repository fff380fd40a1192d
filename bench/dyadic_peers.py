"""The issue's reference baselines (Vowpal Wabbit, myfm) on bench.dyadic's own splits.

``python -m bench.dyadic_peers [DATASET ...] [--splits N] [--seed S] [--quick] [--jobs J]``

Protocol (issue 5, the same as ``bench.dyadic``'s and on exactly its splits:
``bench.dyadic.splits``, default 5 splits, seed 0): random split of the (rater, task, label)
triples of a nominal set (dog, face, product, duck), 15/16 train and 1/16 test, identifiers only
(features: rater id, task id, constant), 0/1 test loss, mean ± sd over the splits and the
per-split values, so that the dyadic model can be compared split for split. Hyperparameters are
chosen on the mean over the splits of the loss on a validation 1/16 held out of each split's
training part (``bench.dyadic``'s ``inner`` parts), never on a test part; the chosen setting is
then trained on the whole training part and scored once on the test part.

Columns:

* VW linear: ``vowpalwabbit`` (9.11.9), examples ``|r r_<id> |t t_<id>`` (VW's own constant),
  best of the reductions (binary: ``--binary`` with squared, logistic or hinge loss; multiclass:
  ``--oaa K``, ``--oaa K --loss_function logistic``, ``--ect K``), learning rate ``-l`` and passes.
  Passes are VW's own multi-pass (``-d train --passes 20 --cache_file .. -k --holdout_off``, in the
  training part's fixed random order); ``--save_per_pass`` models give the validation loss after
  1, 5, 10 and 20 passes out of one run (the same model as a run with that many passes).
* VW lrq: the same plus ``--lrq rtK`` (low-rank quadratic between the rater and task namespaces),
  K in {1, 2, 3}, with and without ``--lrqdropout``.
* myfm: Bayesian factorisation machine (``myfm.MyFMClassifier``, Gibbs sampling, probit link)
  on one-hot rater and task columns (myfm's global bias), ``n_iter`` 200 and 150 kept samples,
  fixed seed; multiclass sets one-against-all (one binary machine per class, argmax of the
  posterior probabilities). ``rank=0`` is accepted by myfm: the Bayesian linear model. The last
  column is the rank in {1, 2, 3, 4, 8} of least validation loss.

``--quick``: a small grid (for the smoke test), not the reported numbers. ``--jobs``: worker
processes (default 2); every fit is seeded, so the numbers do not depend on it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import multiprocessing
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.dyadic_splits import NOMINAL, REFERENCE, constant_loss, load, splits

COLUMNS = ("VW linear", "VW lrq", "myfm r0", "myfm best")


@dataclass(frozen=True)
class Grid:
    rates: tuple[float, ...]
    passes: tuple[int, ...]
    lrq_ks: tuple[int, ...]
    lrq_dropout: tuple[bool, ...]
    ranks: tuple[int, ...]
    n_iter: int
    n_kept: int
    reductions: int | None  # how many of the reductions to try (None: all)


FULL = Grid(
    rates=(0.1, 0.3, 0.5, 1.0, 2.0),
    passes=(1, 5, 10, 20),
    lrq_ks=(1, 2, 3),
    lrq_dropout=(False, True),
    ranks=(1, 2, 3, 4, 8),
    n_iter=200,
    n_kept=150,
    reductions=None,
)
QUICK = Grid(
    rates=(0.5,),
    passes=(1, 5),
    lrq_ks=(2,),
    lrq_dropout=(False,),
    ranks=(2,),
    n_iter=40,
    n_kept=30,
    reductions=1,
)


def reductions(K: int) -> list[tuple[str, str]]:
    """(name, VW options) of the reductions tried, the first one the quick grid's."""
    if K == 2:
        return [
            ("binary logistic", "--binary --loss_function logistic"),
            ("binary hinge", "--binary --loss_function hinge"),
            ("binary squared", "--binary"),
        ]
    return [
        (f"oaa {K} logistic", f"--oaa {K} --loss_function logistic"),
        (f"oaa {K} squared", f"--oaa {K}"),
        (f"ect {K}", f"--ect {K}"),
    ]


# ---------------------------------------------------------------------------------------------
# Vowpal Wabbit


def _vw_label(c: int, K: int) -> str:
    return ("1" if c == 1 else "-1") if K == 2 else str(c + 1)


def _vw_features(w: np.ndarray, i: np.ndarray) -> list[str]:
    return [f"|r r_{a} |t t_{b}" for a, b in zip(w.tolist(), i.tolist(), strict=True)]


def write_vw(path: Path, w: np.ndarray, i: np.ndarray, y: np.ndarray, K: int) -> None:
    feats = _vw_features(w, i)
    with open(path, "w") as f:
        f.writelines(f"{_vw_label(c, K)} {x}\n" for c, x in zip(y.tolist(), feats, strict=True))


def _vw_loss(vw: Any, feats: list[str], y: np.ndarray, K: int) -> float:
    p = np.array([vw.predict(x) for x in feats], dtype=np.float64)
    lab = (p > 0).astype(np.int64) if K == 2 else p.astype(np.int64) - 1
    return float(np.mean(lab != y))


def vw_task(
    train: str,
    feats: list[str],
    y: np.ndarray,
    K: int,
    opts: str,
    rate: float,
    passes: tuple[int, ...],
    seed: int,
) -> list[float]:
    """0/1 loss on (feats, y) after each of ``passes`` passes of VW over the file ``train``."""
    from vowpalwabbit import Workspace

    work = tempfile.mkdtemp(prefix="vw", dir=Path(train).parent)
    try:
        model = os.path.join(work, "m")
        base = f"--quiet --random_seed {seed} {opts} -l {rate}"
        vw = Workspace(
            f"{base} -d {train} --passes {max(passes)} --cache_file {work}/cache -k "
            f"--holdout_off -f {model} --save_per_pass"
        )
        out = {max(passes): _vw_loss(vw, feats, y, K)}
        vw.finish()
        for p in passes:
            if p not in out:  # the model saved after pass p (1-based) of the same run
                m = Workspace(f"--quiet -t -i {model}.{p}")
                out[p] = _vw_loss(m, feats, y, K)
                m.finish()
        return [out[p] for p in passes]
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# myfm


def _onehot(w: np.ndarray, i: np.ndarray, n_w: int, n_i: int) -> Any:
    import scipy.sparse as sps

    n = w.size
    cols = np.stack([w, n_w + i], axis=1).ravel()
    return sps.csr_matrix((np.ones(2 * n), cols, np.arange(0, 2 * n + 1, 2)), shape=(n, n_w + n_i))


def myfm_task(
    w: np.ndarray,
    i: np.ndarray,
    y: np.ndarray,
    K: int,
    a: np.ndarray,
    b: np.ndarray,
    rank: int,
    n_iter: int,
    n_kept: int,
    seed: int,
) -> float:
    """0/1 loss on b of myfm (rank ``rank``) fitted on a; one-against-all when K > 2."""
    import myfm

    n_w, n_i = int(w.max()) + 1, int(i.max()) + 1
    Xa, Xb = _onehot(w[a], i[a], n_w, n_i), _onehot(w[b], i[b], n_w, n_i)
    probs = []
    for c in [1] if K == 2 else range(K):
        fm = myfm.MyFMClassifier(rank=rank, random_seed=seed + c)
        with contextlib.redirect_stderr(io.StringIO()):  # myfm's tqdm bar
            fm.fit(
                Xa,
                (y[a] == c).astype(np.int64),
                n_iter=n_iter,
                n_kept_samples=n_kept,
                callback=lambda *_: (False, None),
            )
        probs.append(fm.predict_proba(Xb, n_workers=1))
    P = np.asarray(probs)
    lab = (P[0] > 0.5).astype(np.int64) if K == 2 else P.argmax(axis=0)
    return float(np.mean(lab != y[b]))


# ---------------------------------------------------------------------------------------------


class _Serial(Executor):
    """In-process executor (``--jobs 1``, the test)."""

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
        f: Future[Any] = Future()
        f.set_result(fn(*args, **kwargs))
        return f


def _mean_sd(v: Sequence[float]) -> tuple[float, float]:
    return float(np.mean(v)), float(np.std(v, ddof=1)) if len(v) > 1 else 0.0


def _fmt(v: Sequence[float]) -> str:
    m, s = _mean_sd(v)
    return f"{m:.3f} ± {s:.3f}"


@dataclass
class Result:
    name: str
    n: int
    K: int
    rows: dict[str, list[float]]  # model -> test loss per split
    chosen: dict[str, str]  # column -> the configuration chosen on validation
    validation: dict[str, float]  # column -> its mean validation loss
    seconds: float


def run(
    name: str, n_splits: int = 5, seed: int = 0, quick: bool = False, ex: Executor | None = None
) -> Result:
    """The four columns on ``bench.dyadic.splits(n, n_splits, seed)`` of the set ``name``."""
    t0 = time.perf_counter()
    grid = QUICK if quick else FULL
    ex = ex or _Serial()
    w, i, y, K = load(name)
    sp = splits(y.size, n_splits, seed)
    inner = [(tr[: -(tr.size // 16)], tr[-(tr.size // 16) :]) for tr, _ in sp]
    reds = reductions(K)[: grid.reductions]
    vw_configs: list[tuple[str, str, float]] = []  # (column, options, rate), grid order
    for (_, opts), rate in itertools.product(reds, grid.rates):
        vw_configs.append(("VW linear", opts, rate))
    for (_, opts), k, drop, rate in itertools.product(
        reds, grid.lrq_ks, grid.lrq_dropout, grid.rates
    ):
        lrq = f" --lrq rt{k}" + (" --lrqdropout" if drop else "")
        vw_configs.append(("VW lrq", opts + lrq, rate))
    chosen: dict[str, str] = {}
    validation: dict[str, float] = {}
    rows: dict[str, list[float]] = {"constant": [constant_loss(y, tr, te, False) for tr, te in sp]}
    tmp = Path(tempfile.mkdtemp(prefix=f"dyadic_peers_{name}_"))
    try:
        files = []
        for s, ((a, _), (tr, _)) in enumerate(zip(inner, sp, strict=True)):
            write_vw(tmp / f"inner{s}.vw", w[a], i[a], y[a], K)
            write_vw(tmp / f"outer{s}.vw", w[tr], i[tr], y[tr], K)
            files.append((str(tmp / f"inner{s}.vw"), str(tmp / f"outer{s}.vw")))
        # validation: every VW configuration and myfm rank on every split's inner parts
        vw_val = {
            (c, s): ex.submit(
                vw_task,
                files[s][0],
                _vw_features(w[b], i[b]),
                y[b],
                K,
                c[1],
                c[2],
                grid.passes,
                seed,
            )
            for c in vw_configs
            for s, (_, b) in enumerate(inner)
        }
        ranks = (0, *grid.ranks)
        fm_val = {
            (r, s): ex.submit(myfm_task, w, i, y, K, a, b, r, grid.n_iter, grid.n_kept, seed)
            for r in ranks
            for s, (a, b) in enumerate(inner)
        }
        # choose: least mean validation loss, ties to the earlier configuration in grid order
        best: dict[str, tuple[float, str, float, int]] = {}
        for c in vw_configs:
            per_pass = np.mean([vw_val[c, s].result() for s in range(n_splits)], axis=0)
            for p, v in zip(grid.passes, per_pass, strict=True):
                if c[0] not in best or v < best[c[0]][0]:
                    best[c[0]] = (float(v), c[1], c[2], p)
        fm_mean = {
            r: float(np.mean([fm_val[r, s].result() for s in range(n_splits)])) for r in ranks
        }
        best_rank = min(grid.ranks, key=lambda r: (fm_mean[r], grid.ranks.index(r)))
        # test: the chosen settings trained on each whole training part
        tests: dict[tuple[str, int], Future[Any]] = {
            (col, s): ex.submit(
                vw_task, files[s][1], _vw_features(w[te], i[te]), y[te], K, opts, rate, (p,), seed
            )
            for col, (_, opts, rate, p) in best.items()
            for s, (_, te) in enumerate(sp)
        }
        for r, col in ((0, "myfm r0"), (best_rank, "myfm best")):
            for s, (tr, te) in enumerate(sp):
                tests[col, s] = ex.submit(
                    myfm_task, w, i, y, K, tr, te, r, grid.n_iter, grid.n_kept, seed
                )
        for col in COLUMNS:
            rows[col] = [float(np.ravel(tests[col, s].result())[0]) for s in range(n_splits)]
        for col, (v, opts, rate, p) in best.items():
            chosen[col] = f"{opts} -l {rate} --passes {p}"
            validation[col] = v
        chosen["myfm r0"] = f"rank 0, n_iter {grid.n_iter}, {grid.n_kept} kept"
        validation["myfm r0"] = fm_mean[0]
        chosen["myfm best"] = (
            f"rank {best_rank}, n_iter {grid.n_iter}, {grid.n_kept} kept (validation: "
            + ", ".join(f"r{r}:{v:.3f}" for r, v in fm_mean.items())
            + ")"
        )
        validation["myfm best"] = fm_mean[best_rank]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Result(name, int(y.size), K, rows, chosen, validation, time.perf_counter() - t0)


def report(res: Result) -> None:
    print(
        f"\n{res.name}: {res.n} answers, {res.K} classes, 0/1 test loss "
        f"(mean ± sd over {len(res.rows['constant'])} splits; per split)"
    )
    for model, v in res.rows.items():
        per = " ".join(f"{x:.3f}" for x in v)
        print(f"  {model:<10} {_fmt(v)}   [{per}]")
    for col in COLUMNS:
        print(f"  chosen {col:<10} validation {res.validation[col]:.3f}: {res.chosen[col]}")
    print(f"  wall time {res.seconds:.1f} s")


def summary(results: list[Result]) -> None:
    print("\nsummary: 0/1 test loss on bench.dyadic's splits, mean ± sd (the issue's value)")
    print("| dataset | " + " | ".join(COLUMNS) + " |")
    print("|---|" + "---|" * len(COLUMNS))
    for res in results:
        ref = REFERENCE.get(res.name)
        cells = [
            _fmt(res.rows[col]) + (f" ({ref[j]:.3f})" if ref else "")
            for j, col in enumerate(COLUMNS)
        ]
        print(f"| {res.name} | " + " | ".join(cells) + " |")


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("datasets", nargs="*", default=list(NOMINAL))
    ap.add_argument("--splits", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="small grid (smoke test)")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    args = ap.parse_args(argv)
    import myfm
    import vowpalwabbit

    g = QUICK if args.quick else FULL
    print(
        f"bench.dyadic_peers: splits={args.splits} seed={args.seed} quick={args.quick} "
        f"jobs={args.jobs} (vowpalwabbit {vowpalwabbit.__version__}, myfm {myfm.__version__})"
    )
    print(
        f"grid: -l {g.rates}, passes {g.passes}, lrq k {g.lrq_ks}, lrqdropout "
        f"{g.lrq_dropout}, myfm ranks {g.ranks}, n_iter {g.n_iter}, kept {g.n_kept}"
    )
    t0 = time.perf_counter()
    pool: Callable[[], Executor] = (
        (lambda: ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("fork")))
        if args.jobs > 1
        else _Serial
    )
    results = []
    with pool() as ex:
        for name in args.datasets:
            res = run(name, args.splits, args.seed, args.quick, ex)
            report(res)
            results.append(res)
    summary(results)
    print(f"\ntotal wall time {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
