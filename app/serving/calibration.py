"""The calibration report of a project with gold: how its posteriors score on the items whose
answer is known, each gold item scored by a model that did not see its gold (docs/model.md
eq. 24, "The calibration report").

The served model learned from every gold item, so its workers look more right on those items
than on the others: scored under it, gold items overstate the accuracy (by about 3 points
over the shared datasets with 5% gold). The report therefore cross-fits both halves of the
served posterior: the gold items are split into FOLDS folds by name, and each fold's items
are scored by a batch EM fit on every answer of the project with the other folds' gold only
(or by one online pass, where the service would decline that fit: ``REFIT_MIN_AGREEMENT``),
calibrated (eq. 24) on the other folds' scores.

That costs FOLDS batch EM fits over the whole project, so a report is kept (``REPORTS``,
``app.serving.kept``): served again while nothing has been applied since, or for ten times
what it took to make. The report says at which log position it was made.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import numpy as np
import orjson

from app.engine.project import REFIT_MIN_AGREEMENT
from app.serving.kept import Kept
from app.serving.nominal import Globals
from app.store.base import Store
from core.batch import BatchEM
from core.blocks import FloatArray, IntArray, LabelBlocks
from core.calibration import Calibration, Reliability, cross_fitted, reliability
from core.nominal import NominalConfig, NominalParams
from core.online import OnlineEM
from core.served import log_likelihoods, log_prior, subset

FOLDS = 5
MAX_ITER = 30
"""E-steps of each fold's batch EM fit at most (SQUAREM-accelerated from majority vote; on a
100,000-answer project with 500 gold items the report took 1.4 s, 1.8 s with fits to
convergence, and its figures were the same to two decimals)."""
REPORTS: Kept[CalibrationReport] = Kept(reuse=10.0)
"""The reports kept (``app.serving.kept``): served again for ten times what one took."""


@dataclass(frozen=True)
class CalibrationReport:
    calibration: Calibration
    """The calibration the project serves with now (fitted with all its gold)."""
    scores: Reliability
    """Accuracy, ECE, NLL, Brier and bins on the gold items, cross-fitted over FOLDS folds."""
    position: int
    computed_at: float


@dataclass(frozen=True)
class _Answers:
    """Every answer of a project, one block per item (items in name order), exact workers."""

    blocks: LabelBlocks
    n_workers: int
    gold: IntArray
    """Each item's gold class, -1 where it has none."""


def calibration_report(
    store: Store, project: str, config: NominalConfig, created_at: float = 0.0
) -> CalibrationReport:
    """The report of ``project`` (the one created at ``created_at``): the one kept, while it
    may be served again, else a new one (see the module's docstring)."""

    def make() -> tuple[CalibrationReport, int]:
        report = make_report(store, project, config)
        return report, report.position

    return REPORTS.get(store, project, created_at, make)


def make_report(store: Store, project: str, config: NominalConfig) -> CalibrationReport:
    """Score every gold item that has answers, cross-fitted (see the module's docstring)."""
    gblob, _ = store.get_params(project, [])
    g = Globals.parse(gblob, config)
    if g.n_gold == 0:  # nothing to score: no scan of every answer, no fit
        nothing = reliability(np.zeros((0, config.n_classes)), np.zeros(0, dtype=np.int64))
        return CalibrationReport(g.calibration, nothing, g.position, g.computed_at)
    answers = _read_answers(store, project)
    scored = np.flatnonzero((answers.gold >= 0) & (answers.blocks.sizes() > 0))
    logits, n = _held_out(answers, scored, config)
    truth = answers.gold[scored]
    K = config.n_classes
    served = cross_fitted(logits, n, np.zeros(K), truth, g.evidence, FOLDS)
    return CalibrationReport(g.calibration, reliability(served, truth), g.position, g.computed_at)


def _held_out(
    answers: _Answers, scored: IntArray, config: NominalConfig
) -> tuple[FloatArray, FloatArray]:
    """log pi + l_i and n_i of each ``scored`` item under a batch EM fit that was not given
    the gold of the item's fold (item k of ``scored`` is in fold k mod FOLDS, as in
    ``cross_fitted``)."""
    K = config.n_classes
    logits, n = np.empty((scored.size, K)), np.empty(scored.size)
    fold = np.arange(scored.size) % FOLDS
    answered = answers.blocks.total_weight() > 0
    for f in range(min(FOLDS, scored.size)):
        held = scored[fold == f]
        known = answers.gold.copy()
        known[held] = -1
        fit, params = BatchEM(config, max_iter=MAX_ITER).fit(
            answers.blocks, answers.n_workers, known=known
        )
        online = _online_pass(answers, config, known)
        if online is not None:
            agree = fit.probas.argmax(axis=1) == online[0].argmax(axis=1)
            if agree[answered].mean() < REFIT_MIN_AGREEMENT:  # as the service would decline it
                params = online[1]
        ell, weight = log_likelihoods(params, subset(answers.blocks, held))
        logits[fold == f] = ell + log_prior(params)
        n[fold == f] = weight
    return logits, n


def _online_pass(
    answers: _Answers, config: NominalConfig, known: IntArray
) -> tuple[FloatArray, NominalParams] | None:
    """One online pass over the answers (exact workers) with the gold ``known``: what the
    service serves where it declines batch EM's fit (few answers an item, where batch EM falls
    into a one-class fit; docs/model.md, "A limit"), its posteriors and parameters."""
    if not answers.blocks.n_labels:
        return None
    online = OnlineEM(config.with_(n_worker_slots=answers.n_workers))
    learned = online.learn_many(answers.blocks, known=known)
    return learned.posteriors, online.params


def _read_answers(store: Store, project: str) -> _Answers:
    """Scan the project's items: their answers (workers coded in name order, as
    ``factorize`` codes them) and gold, in item-name order (the folds are then the same on
    every read). The answers are held as typed arrays as the pages come: held as Python lists
    and coded through one array of every answer's worker name, 45.7M answers took more than
    the machine's 24 GB."""
    names: list[str] = []
    gold: list[int] = []
    sizes = array("q")
    workers, labels, weights = array("q"), array("q"), array("d")
    code_of: dict[str, int] = {}
    cursor = 0
    while True:
        cursor, page = store.scan_items(project, cursor, 2000)
        for name, blob in page:
            d = orjson.loads(blob)
            given = d["labels"]
            names.append(name)
            gold.append(-1 if d.get("gold") is None else int(d["gold"]))
            sizes.append(len(given))
            for w, label, h in given:
                workers.append(code_of.setdefault(w, len(code_of)))
                labels.append(label)
                weights.append(h)
        if cursor == 0:
            break
    order = np.array(sorted(range(len(names)), key=names.__getitem__), dtype=np.int64)
    size = np.frombuffer(sizes, dtype=np.int64)[order]
    start = np.concatenate([[0], np.cumsum(np.frombuffer(sizes, dtype=np.int64))])[order]
    ptr = np.concatenate([[0], np.cumsum(size)]).astype(np.int64)
    # each label's place in the pages' order, item after item in name order
    take = np.repeat(start - ptr[:-1], size) + np.arange(ptr[-1], dtype=np.int64)
    rank = np.empty(len(code_of), dtype=np.int64)  # worker codes in name order
    rank[[code_of[w] for w in sorted(code_of)]] = np.arange(len(code_of))
    blocks = LabelBlocks(
        ptr,
        rank[np.frombuffer(workers, dtype=np.int64)[take]],
        np.frombuffer(labels, dtype=np.int64)[take],
        np.frombuffer(weights, dtype=np.float64)[take],
    )
    return _Answers(blocks, max(len(code_of), 1), np.array(gold, dtype=np.int64)[order])
