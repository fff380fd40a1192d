"""How far calibration can go on a crowd: ``python -m bench.calibration_limits``.

Three measurements per crowd, each scored on the items with gold (ECE in points, 10 bins):

* ``floor``: the expected ECE of a *perfectly calibrated* model with the served posterior's
  confidences, scored on the same items: truth drawn from the served posterior itself, mean
  over ``--draws`` draws. The binned ECE of a finite set is never 0; below this no figure
  means anything.
* ``best (rho, eps)``: the smallest ECE any calibration of the served family (docs/model.md
  eq. 21) reaches, with rho and eps chosen on all the gold (in-sample): what perfect use of
  gold could give.
* ``VB-DS``: variational Bayes Dawid-Skene (IBCC: Dirichlet rows per worker pooled toward the
  crowd's confusion matrix, the pooling strength chosen by empirical Bayes, the E-step on
  digamma expectations), against batch EM's own posterior (``batch-raw``): whether averaging
  over each worker's confusion uncertainty removes the overconfidence.

``--twins 0.1,0.3``: for each crowd, twins with the very same answers whose gold differs on
that share of the items (moved to another class): a crowd that errs together on those items,
as the answers see it (docs/model.md eq. 23). Every method that reads answers alone serves
each twin the same posteriors, so its ECE on the crowd and on a twin cannot both be small.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import digamma, gammaln

from bench.crowds import SYNTHETIC, Crowd, load_shared, synthetic
from bench.datasets import DEFAULT_ROOT, dataset_names
from bench.quality import F64, I64, accuracy, ece, exact_blocks, nominal_config, vote_shares
from core.batch import BatchEM
from core.calibration import Calibration
from core.served import batch_calibration, log_likelihoods, log_prior

RHOS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0)
EPSS = (0.0, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3)
STRENGTHS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
"""Pooling strengths (Dirichlet concentration per row) that empirical Bayes chooses from."""


@dataclass(frozen=True)
class Limits:
    crowd: str
    n_scored: int
    served_ece: float
    floor: float
    best_ece: float
    best_rho: float
    best_eps: float
    batch_raw_ece: float
    batch_raw_acc: float
    vbds_ece: float
    vbds_acc: float
    vbds_strength: float


def soft_counts(crowd: Crowd, q: F64) -> F64:
    """N[w, z, l] = sum of q_i(z) over worker w's answers l."""
    K = crowd.n_classes
    out = np.zeros((crowd.n_workers, K, K))
    for z in range(K):
        np.add.at(out[:, z, :], (crowd.worker, crowd.label), q[crowd.item, z])
    return out


def pooled_strength(counts: F64, mean: F64) -> float:
    """The strength s maximising the Dirichlet-multinomial evidence of every worker's rows
    under Dir(s * mean[z]) (empirical Bayes)."""

    def evidence(s: float) -> float:
        a = s * mean
        n = counts.sum(axis=2)
        per_row = gammaln(a.sum(axis=1))[None] - gammaln(a.sum(axis=1)[None] + n)
        return float((per_row + (gammaln(a[None] + counts) - gammaln(a)[None]).sum(axis=2)).sum())

    return max(STRENGTHS, key=evidence)


def vb_dawid_skene(crowd: Crowd, iters: int = 100, tol: float = 1e-6) -> tuple[F64, float]:
    """IBCC's mean-field updates from majority-vote posteriors; (posteriors, last strength)."""
    q = vote_shares(crowd)
    strength = STRENGTHS[0]
    for _ in range(iters):
        counts = soft_counts(crowd, q)
        pooled = counts.sum(axis=0) + 1.0
        mean = pooled / pooled.sum(axis=1, keepdims=True)
        strength = pooled_strength(counts, mean)
        rows = strength * mean[None] + counts
        e_log = digamma(rows) - digamma(rows.sum(axis=2, keepdims=True))
        prior = 1.0 + q.sum(axis=0)
        logits = np.tile(digamma(prior) - digamma(prior.sum()), (crowd.n_items, 1))
        for z in range(crowd.n_classes):
            np.add.at(logits[:, z], crowd.item, e_log[crowd.worker, z, crowd.label])
        new = np.exp(logits - logits.max(axis=1, keepdims=True))
        new /= new.sum(axis=1, keepdims=True)
        done = float(np.abs(new - q).max()) < tol
        q = new
        if done:
            break
    return q, strength


def perfect_floor(posteriors: F64, draws: int, seed: int = 0) -> float:
    """Mean ECE of ``posteriors`` against truths drawn from them."""
    rng = np.random.default_rng(seed)
    cum = np.cumsum(posteriors, axis=1)
    out = []
    for _ in range(draws):
        u = np.asarray(rng.random(size=posteriors.shape[0]))
        truth = (u[:, None] > cum).sum(axis=1)
        out.append(ece(posteriors, np.minimum(truth, posteriors.shape[1] - 1).astype(np.int64)))
    return float(np.mean(out))


def limits(crowd: Crowd, draws: int = 200) -> Limits:
    gold: I64 = crowd.gold
    has = gold >= 0
    config = nominal_config(crowd)
    blocks = exact_blocks(crowd)
    result, params = BatchEM(config).fit(blocks, crowd.n_workers)
    cal = batch_calibration(config, params, blocks, crowd.n_workers)
    ell, n = log_likelihoods(params, blocks)
    lp = log_prior(params)
    served = cal.from_log_likelihood(ell, n, lp)
    grid = [
        (ece(Calibration(r, e).from_log_likelihood(ell, n, lp), gold), r, e)
        for r in RHOS
        for e in EPSS
    ]
    best = min(grid)
    vb, strength = vb_dawid_skene(crowd)
    return Limits(
        crowd.name, int(has.sum()), ece(served, gold), perfect_floor(served[has], draws),
        best[0], best[1], best[2], ece(result.probas, gold), 100.0 * accuracy(result.probas, gold),
        ece(vb, gold), 100.0 * accuracy(vb, gold), strength,
    )  # fmt: skip


def consensus_twin(crowd: Crowd, share: float, seed: int = 0) -> Crowd:
    """The same answers, the gold of ``share`` of the items with gold moved to another class
    (uniformly): what a crowd that errs together on those items looks like to the answers."""
    rng = np.random.default_rng(seed)
    gold = crowd.gold.copy()
    has = np.flatnonzero(gold >= 0)
    moved = rng.choice(has, round(share * has.size), replace=False)
    gold[moved] = (gold[moved] + rng.integers(1, crowd.n_classes, moved.size)) % crowd.n_classes
    return dataclasses.replace(
        crowd, name=f"{crowd.name} +{share:g}", gold=gold,
        oracle=None, answer_loglik=None, log_prior=None,
    )  # fmt: skip


def twins_table(crowd: Crowd, shares: Sequence[float]) -> str:
    """ECE and accuracy of batch EM's served posterior and of majority vote, each computed
    once from the answers, on the crowd and on each of its consensus twins."""
    config = nominal_config(crowd)
    blocks = exact_blocks(crowd)
    _, params = BatchEM(config).fit(blocks, crowd.n_workers)
    cal = batch_calibration(config, params, blocks, crowd.n_workers)
    ell, n = log_likelihoods(params, blocks)
    served, votes = cal.from_log_likelihood(ell, n, log_prior(params)), vote_shares(crowd)
    lines = [
        "the same answers, gold moved on a share of the items: ECE in points / accuracy in %",
        f"{'crowd':28s} {'served':>14s} {'majority vote':>14s}",
    ]
    for twin in [crowd, *(consensus_twin(crowd, x) for x in shares)]:
        cells = [f"{ece(q, twin.gold):6.2f} / {100 * accuracy(q, twin.gold):5.2f}"
                 for q in (served, votes)]  # fmt: skip
        lines.append(f"{twin.name:28s} {cells[0]:>14s} {cells[1]:>14s}")
    return "\n".join(lines)


def table(rows: Sequence[Limits]) -> str:
    head = (
        f"{'crowd':20s} {'scored':>6s} {'served':>7s} {'floor':>6s} {'best':>6s} "
        f"{'rho':>5s} {'eps':>5s} {'batch-raw':>9s} {'VB-DS':>6s} {'acc raw':>8s} "
        f"{'acc VB':>7s} {'s':>5s}"
    )
    lines = ["ECE in points on gold items; accuracy in %", head]
    for r in rows:
        lines.append(
            f"{r.crowd:20s} {r.n_scored:6d} {r.served_ece:7.2f} {r.floor:6.2f} {r.best_ece:6.2f} "
            f"{r.best_rho:5.2f} {r.best_eps:5.2f} {r.batch_raw_ece:9.2f} {r.vbds_ece:6.2f} "
            f"{r.batch_raw_acc:8.2f} {r.vbds_acc:7.2f} {r.vbds_strength:5.1f}"
        )
    mean = [
        float(np.mean([getattr(r, f) for r in rows]))
        for f in ("served_ece", "floor", "best_ece", "batch_raw_ece", "vbds_ece",
                  "batch_raw_acc", "vbds_acc")
    ]  # fmt: skip
    lines.append(
        f"{'mean':20s} {'':6s} {mean[0]:7.2f} {mean[1]:6.2f} {mean[2]:6.2f} {'':5s} {'':5s} "
        f"{mean[3]:9.2f} {mean[4]:6.2f} {mean[5]:8.2f} {mean[6]:7.2f}"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.calibration_limits", description=__doc__)
    ap.add_argument("--datasets", default=None, help="comma-separated shared sets (default: all)")
    ap.add_argument("--synthetic", default="none", help=f"regimes of {list(SYNTHETIC)} or 'none'")
    ap.add_argument("--draws", type=int, default=200)
    ap.add_argument("--twins", default=None, metavar="SHARES",
                    help="consensus twins of each crowd instead (e.g. 0.1,0.3)")  # fmt: skip
    args = ap.parse_args(argv)
    names = dataset_names(DEFAULT_ROOT) if args.datasets is None else args.datasets.split(",")
    regimes = [] if args.synthetic.strip() == "none" else args.synthetic.split(",")
    crowds = [load_shared(n) for n in names if n] + [synthetic(r) for r in regimes if r]
    if args.twins is not None:
        shares = [float(x) for x in args.twins.split(",") if x.strip()]
        if any(not 0.0 < x < 1.0 for x in shares):
            ap.error("--twins: shares between 0 and 1")
        print("\n\n".join(twins_table(crowd, shares) for crowd in crowds))
        return 0
    rows = []
    for crowd in crowds:
        print(f"{crowd.name} ...", file=sys.stderr, flush=True)
        rows.append(limits(crowd, args.draws))
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
