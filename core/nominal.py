"""The nominal label model: hyperparameters and parameters (docs/model.md has the math).

Notation follows seed 004. For K classes and S worker slots:

* ``class_logits`` (K,): gamma_pi, the class prior is pi = softmax(gamma_pi);
* ``population`` (K, K): Gamma, the population confusion in logit form (row = true class,
  column = answer);
* ``worker`` (S, K, K): A, each slot's deviation from the population, so the slot's
  confusion logits are Theta_s = Gamma + A_s. It is stored scaled: A = ``scale`` * stored,
  which makes the prior's uniform shrinkage of every slot an O(1) update (see _kernels).

A worker with little data, or a slot shared by many workers, keeps A_s near 0 under its
Gaussian prior and is modelled by the population matrix.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any

import numpy as np
import numpy.typing as npt

from core.evidence import evidence_size
from core.hashing import DEFAULT_WORKER_SLOTS

FloatArray = npt.NDArray[np.float64]

# Indices into NominalParams.scalars (kept in an array so kernels can update them in place).
SCALE, STEP = 0, 1


class LaterPasses(StrEnum):
    """How passes after the first move the online model: revisit items one by one
    (``OnlineEM.revisit_many``) or sweep by trust-region Newton (``OnlineEM.refine``)."""

    revisit = "revisit"
    newton = "newton"


MAX_FIRST_STEP = 1e6
"""The largest first step eta0 tau0^-rho x max(1, population_rate K/2, class_rate) a new project
or run may take (0.95 by default): eta0 1e6 with rho 0 and a class_rate of 100 or a
population step of 1000 made the parameters NaN; every product up to 1e6 tried stayed finite.
(Checked where a model is made, not where a saved one is read.)"""


def first_step(eta0: float, tau0: float, rho: float, rate: float = 1.0) -> float:
    """eta_t at t = 0 (eq. 9) times ``rate`` (inf where tau0 is 0 and rho > 0)."""
    with np.errstate(divide="ignore", over="ignore"):
        return float(eta0 * np.float64(tau0) ** -rho * rate)


@dataclass(frozen=True)
class NominalConfig:
    """Hyperparameters of the model and of its online and batch fits."""

    n_classes: int
    """K, the number of classes."""
    n_worker_slots: int = DEFAULT_WORKER_SLOTS
    """S, the number of hashed worker slots."""
    class_prior: tuple[float, ...] | None = None
    """Prior class distribution (--priorz), normalised; uniform when None."""
    eta0: float = 30.0
    """eta_0 of the step size eta_t = eta_0 (tau_0 + t)^-rho."""
    tau0: float = 100.0
    """tau_0 (--initial-t)."""
    rho: float = 0.75
    """rho, the decay exponent."""
    n_items: float = 10_000.0
    """|I| (--n-items): the prior enters each item's F_i with weight 1/|I|."""
    worker_prior: float = 1.0
    """lambda_A: precision of the Gaussian prior pulling each slot's A_s toward 0."""
    population_prior: float = 0.1
    """lambda_Gamma at two classes: the precision of the prior pulling Gamma toward its mean
    is this times K/2 (``population_precision``, docs/model.md "Parameters")."""
    population_diagonal: float = 1.75
    """c_0: the prior mean of Gamma is c_0 on the diagonal, 0 elsewhere (workers beat chance)."""
    class_prior_strength: float = 1.0
    """lambda_pi: precision of the prior pulling gamma_pi toward log(class_prior)."""
    difficulty: bool = False
    """Model a per-item clarity d_i = exp(b_i) that scales every worker's logits."""
    difficulty_prior: float = 1.0
    """lambda_b: precision of the Gaussian prior on b_i."""
    em_tol: float = 1e-6
    """Per-item EM stops when b_i moves less than this (no-difficulty EM is exact in one step)."""
    em_max_iter: int = 50
    """At most this many per-item EM rounds."""
    population_rate: float = 0.04
    """Step of Gamma relative to eta_t at two classes (Gamma sees every label, a slot only its
    own); a row of Gamma learns from the items of its class, about 1/K of them, so its step
    is this times K/2 (``population_step``, docs/model.md eq. 10)."""
    class_rate: float = 0.02
    """Step of gamma_pi relative to eta_t."""

    def __post_init__(self) -> None:
        checks = {
            "n_classes must be at least 2": self.n_classes >= 2,
            "n_worker_slots must be at least 1": self.n_worker_slots >= 1,
            "eta0 must be >= 0": self.eta0 >= 0,
            "tau0 must be >= 0": self.tau0 >= 0,
            "rho must be >= 0": self.rho >= 0,
            "n_items must be > 0": self.n_items > 0,
            "worker_prior must be > 0": self.worker_prior > 0,
            "population_prior must be > 0": self.population_prior > 0,
            "class_prior_strength must be > 0": self.class_prior_strength > 0,
            "difficulty_prior must be > 0": self.difficulty_prior > 0,
            "em_tol must be > 0": self.em_tol > 0,
            "em_max_iter must be >= 1": self.em_max_iter >= 1,
        }
        failed = [msg for msg, ok in checks.items() if not ok]
        if failed:
            raise ValueError("; ".join(failed))
        if self.class_prior is not None:
            prior = np.asarray(self.class_prior, dtype=np.float64)
            with np.errstate(over="ignore"):
                total = prior.sum()
            if prior.shape != (self.n_classes,) or not np.all(prior > 0) or not np.isfinite(total):
                raise ValueError(
                    f"class_prior needs {self.n_classes} positive numbers of finite sum, got "
                    f"{self.class_prior}"
                )

    def population_precision(self) -> float:
        """lambda_Gamma: ``population_prior`` K/2. A row of Gamma spreads what its class's
        answers say over K cells, so each off-diagonal cell sees about 1/K as much as at two
        classes; a precision that grows with K keeps those cells as firmly held. At 0.1 for
        every K, 64 classes from 200 items of 15 answers (70% right) were served 85% right
        after one pass and 78% after an idle sweep, 256 classes 18% and 7%, where majority
        vote was right on every item."""
        return self.population_prior * self.n_classes / 2.0

    def population_step(self) -> float:
        """r_Gamma of eq. 10: ``population_rate`` K/2, so that each row of Gamma, which learns
        from the items of its class only, steps as far over a pass whatever K."""
        return self.population_rate * self.n_classes / 2.0

    def first_step(self) -> float:
        """The first step of the shared parameters (``MAX_FIRST_STEP`` bounds it)."""
        return first_step(
            self.eta0, self.tau0, self.rho, max(1.0, self.population_step(), self.class_rate)
        )

    def with_(self, **changes: Any) -> NominalConfig:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NominalConfig:
        data = dict(data)
        if data.get("class_prior") is not None:
            data["class_prior"] = tuple(float(x) for x in data["class_prior"])
        return cls(**data)

    def class_prior_logits(self) -> FloatArray:
        """log of the normalised class prior: the prior mean of gamma_pi."""
        if self.class_prior is None:
            return np.full(self.n_classes, -np.log(self.n_classes))
        prior = np.asarray(self.class_prior, dtype=np.float64)
        logits: FloatArray = np.log(prior / prior.sum())
        return logits

    def population_mean(self) -> FloatArray:
        """The prior mean of Gamma: c_0 on the diagonal."""
        return self.population_diagonal * np.eye(self.n_classes)

    def log_prior(
        self, class_logits: FloatArray, population: FloatArray, worker: FloatArray
    ) -> float:
        """log P(A, Gamma, gamma_pi) up to a constant (docs/model.md, "Parameters"); ``worker``
        is the deviation table A itself (scale applied)."""
        return -0.5 * (
            self.worker_prior * float(np.sum(worker**2))
            + self.population_precision()
            * float(np.sum((population - self.population_mean()) ** 2))
            + self.class_prior_strength
            * float(np.sum((class_logits - self.class_prior_logits()) ** 2))
        )

    def hyper_vector(self) -> FloatArray:
        """Hyperparameters packed for the kernels (order fixed by _kernels.H_*)."""
        return np.array(
            [
                self.eta0,
                self.tau0,
                self.rho,
                self.n_items,
                self.worker_prior,
                self.population_precision(),
                self.class_prior_strength,
                1.0 if self.difficulty else 0.0,
                self.difficulty_prior,
                self.em_tol,
                float(self.em_max_iter),
                self.population_step(),
                self.class_rate,
            ],
            dtype=np.float64,
        )


def sums_size(n_classes: int) -> int:
    """Length of ``NominalParams.sums``: K*K worker sum, K class totals, 5 counters."""
    return n_classes * n_classes + n_classes + 5


def current_sums(sums: FloatArray, n_classes: int) -> FloatArray:
    """``sums`` in today's layout: state saved before the labels were counted (3 counters)
    gets the count of labels read as their total weight and their log weights' sum as 0
    (labels of weight 1, the default)."""
    if sums.shape == (sums_size(n_classes) - 2,):
        return np.append(sums, [sums[-2], 0.0])
    return sums


@dataclass
class NominalParams:
    """The learned state: everything a replay must reproduce bit for bit."""

    class_logits: FloatArray
    population: FloatArray
    worker: FloatArray
    scalars: FloatArray = field(default_factory=lambda: np.array([1.0, 0.0]))
    counts: FloatArray | None = None
    """N[s, z, l]: each slot's soft label counts under the items' latest posteriors (online
    only; revisits step the slots on them). None until the online model first learns."""
    sums: FloatArray | None = None
    """Summary statistics (online only), layout ``sums_layout(K)``: the sum of the stored
    worker table over slots (K*K), the class totals sum_i q_i (K), the number of items, the
    total label weight, the number of slots with labels, the number of labels of weight above
    0 and the sum of their weights' logs."""
    evidence: FloatArray | None = None
    """Prequential evidence for the calibration's tempering (online only; docs/model.md eq. 22,
    ``core.calibration``): one log-score sum per rho of RHO_GRID, then the weight scored."""

    @classmethod
    def initial(cls, config: NominalConfig) -> NominalParams:
        """Parameters at their prior means: every slot is the population."""
        K, S = config.n_classes, config.n_worker_slots
        return cls(
            class_logits=config.class_prior_logits(),
            population=config.population_mean(),
            worker=np.zeros((S, K, K)),
            scalars=np.array([1.0, 0.0]),
            counts=np.zeros((S, K, K)),
            sums=np.zeros(sums_size(K)),
            evidence=np.zeros(evidence_size()),
        )

    @property
    def step(self) -> int:
        """t: how many item blocks have updated the parameters."""
        return int(self.scalars[STEP])

    def worker_logits(self, slots: npt.NDArray[np.int64]) -> FloatArray:
        """Theta_s = Gamma + A_s for the given slots, shape (len(slots), K, K)."""
        logits: FloatArray = self.population[None, :, :] + self.scalars[SCALE] * self.worker[slots]
        return logits

    def worker_confusion(self, slots: npt.NDArray[np.int64]) -> FloatArray:
        """Each slot's confusion matrix: P(answer = l | true class = z), rows sum to 1."""
        return softmax(self.worker_logits(slots))

    def population_confusion(self) -> FloatArray:
        return softmax(self.population)

    def class_priors(self) -> FloatArray:
        return softmax(self.class_logits)

    def copy(self) -> NominalParams:
        return NominalParams(
            self.class_logits.copy(),
            self.population.copy(),
            self.worker.copy(),
            self.scalars.copy(),
            None if self.counts is None else self.counts.copy(),
            None if self.sums is None else self.sums.copy(),
            None if self.evidence is None else self.evidence.copy(),
        )

    def arrays(self) -> dict[str, FloatArray]:
        """Named arrays, e.g. for ``np.savez``; ``from_arrays`` inverts it."""
        out = {
            "class_logits": self.class_logits,
            "population": self.population,
            "worker": self.worker,
            "scalars": self.scalars,
        }
        if self.counts is not None:
            out["counts"] = self.counts
        if self.sums is not None:
            out["sums"] = self.sums
        if self.evidence is not None:
            out["evidence"] = self.evidence
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, FloatArray]) -> NominalParams:
        return cls(
            class_logits=np.array(arrays["class_logits"], dtype=np.float64),
            population=np.array(arrays["population"], dtype=np.float64),
            worker=np.array(arrays["worker"], dtype=np.float64),
            scalars=np.array(arrays["scalars"], dtype=np.float64),
            counts=np.array(arrays["counts"], dtype=np.float64) if "counts" in arrays else None,
            sums=(
                current_sums(
                    np.array(arrays["sums"], dtype=np.float64), len(arrays["class_logits"])
                )
                if "sums" in arrays
                else None
            ),
            evidence=(
                np.array(arrays["evidence"], dtype=np.float64) if "evidence" in arrays else None
            ),
        )

    def equals(self, other: NominalParams) -> bool:
        """Bit-identical parameters and statistics (what replay determinism promises)."""
        mine, theirs = self.arrays(), other.arrays()
        return mine.keys() == theirs.keys() and all(
            np.array_equal(mine[k], theirs[k]) for k in mine
        )


def log_softmax(x: FloatArray) -> FloatArray:
    """log softmax along the last axis (x minus its log-sum-exp)."""
    out: FloatArray = x - np.logaddexp.reduce(x, axis=-1, keepdims=True)
    return out


def softmax(x: FloatArray) -> FloatArray:
    """softmax along the last axis."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    out: FloatArray = e / e.sum(axis=-1, keepdims=True)
    return out
