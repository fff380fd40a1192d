"""Held-out answers predicted through the service: ``python -m bench.predictions``.

The protocol of ``bench.dyadic`` (random split of the triples, 15/16 train and 1/16 test,
identifiers only, 5 splits), run end to end: an embedded service in this process (the
README's default), the training triples POSTed over HTTP in blocks of 1,000, the engine's idle
sweeps awaited (``stats.dyadic_passes`` reaches the project's ``passes``), then the test pairs
sent to ``POST /v1/projects/{p}/predictions``. The service's defaults, nothing tuned per set
(the core bench tunes the learning rate per set on its linear model). Baseline, same process:
the core model with the same config trained on the same triples for the same number of passes
in a fixed order (``core.dyadic`` directly). Nominal sets: 0/1 loss; ordinal sets (web,
trec2010, created with ``"ordinal": true``): 0/1 loss and the mean |code difference|.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson
from fastapi.testclient import TestClient

from app.api import create_app
from app.engine.dyadic import settings_for
from app.settings import Settings
from bench.datasets import DEFAULT_ROOT
from core.dyadic import DyadicModel, dyadic_ids

NOMINAL = ("dog", "face", "product", "duck")
ORDINAL = ("web", "trec2010")
ADMIN = "bench-admin"


def load(name: str) -> tuple[list[dict[str, str]], list[str]]:
    with open(DEFAULT_ROOT / name / "answers.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    labels = sorted({r["label"] for r in rows})
    with contextlib.suppress(ValueError):  # numeric labels (grades) in numeric order
        labels.sort(key=float)
    return rows, labels


def through_service(
    name: str, rows: list[dict[str, str]], labels: list[str], train: np.ndarray, test: np.ndarray
) -> tuple[list[str], float]:
    """(predicted labels of the test pairs, seconds from the first POST to trained)."""
    ordinal = name in ORDINAL
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            data_dir=Path(tmp), admin_key=ADMIN, refine_passes=1, refine_idle_s=0.05,
            snapshot_interval_s=3600.0,
        )  # fmt: skip
        with TestClient(create_app(settings), headers={"Authorization": f"Bearer {ADMIN}"}) as c:
            body = {"name": name, "labels": labels, "dyadic": {"ordinal": ordinal}}
            r = c.post("/v1/projects", json=body)
            r.raise_for_status()
            passes = r.json()["dyadic"]["passes"]
            t0 = time.perf_counter()
            for lo in range(0, train.size, 1000):
                block = [
                    {k: rows[i][k] for k in ("item", "worker", "label")}
                    for i in train[lo : lo + 1000]
                ]
                c.post(f"/v1/projects/{name}/labels", content=orjson.dumps(block))
            while True:
                stats = c.get(f"/v1/projects/{name}").json()["stats"]
                done = stats["n_labels"] == train.size and not stats["lag"]
                done = done and stats["dyadic_position"] == stats["applied"]
                if done and stats["dyadic_passes"] >= passes:
                    break
                time.sleep(0.02)
            seconds = time.perf_counter() - t0
            out: list[str] = []
            for lo in range(0, test.size, 10_000):
                pairs = [{"worker": rows[i]["worker"], "item": rows[i]["item"]} for i in test[lo : lo + 10_000]]  # fmt: skip
                r = c.post(f"/v1/projects/{name}/predictions", content=orjson.dumps(pairs))
                r.raise_for_status()
                out.extend(p["label"] for p in r.json()["predictions"])
    return out, seconds


def core_baseline(
    name: str, rows: list[dict[str, str]], labels: list[str], train: np.ndarray, test: np.ndarray
) -> list[str]:
    settings = settings_for(len(labels), ordinal=name in ORDINAL)
    code = {v: k for k, v in enumerate(labels)}
    model = DyadicModel(settings.config)
    w = dyadic_ids(rows[i]["worker"] for i in train)
    t = dyadic_ids(rows[i]["item"] for i in train)
    y = np.array([code[rows[i]["label"]] for i in train], dtype=np.int64)
    for _ in range(settings.passes):
        model.learn_many(w, t, y)
    pred, _ = model.predict(
        dyadic_ids(rows[i]["worker"] for i in test), dyadic_ids(rows[i]["item"] for i in test)
    )
    return [labels[k] for k in pred.tolist()]


def losses(
    labels: list[str], truth: list[str], predicted: list[str], ordinal: bool
) -> tuple[float, float]:
    wrong = float(np.mean([p != y for p, y in zip(predicted, truth, strict=True)]))
    if not ordinal:
        return wrong, float("nan")
    code = {v: k for k, v in enumerate(labels)}
    dist = np.mean([abs(code[p] - code[y]) for p, y in zip(predicted, truth, strict=True)])
    return wrong, float(dist)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m bench.predictions", description=__doc__.split("\n")[0]
    )
    ap.add_argument("sets", nargs="*", default=[*NOMINAL, *ORDINAL])
    ap.add_argument("--splits", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print("set        metric     service (mean ± sd)  core baseline    service - core  train s")
    for name in args.sets:
        rows, labels = load(name)
        ordinal = name in ORDINAL
        svc, core, secs = [], [], []
        for s in range(args.splits):
            perm = np.random.default_rng(args.seed + s).permutation(len(rows))
            n_train = len(rows) * 15 // 16
            train, test = perm[:n_train], perm[n_train:]
            truth = [rows[i]["label"] for i in test]
            got, seconds = through_service(name, rows, labels, train, test)
            svc.append(losses(labels, truth, got, ordinal))
            core.append(
                losses(labels, truth, core_baseline(name, rows, labels, train, test), ordinal)
            )
            secs.append(seconds)
        a, b = np.array(svc), np.array(core)
        metrics = ["0/1", "|code|"] if ordinal else ["0/1"]
        for m, metric in enumerate(metrics):
            print(
                f"{name:<10} {metric:<10} {a[:, m].mean():.3f} ± {a[:, m].std():.3f}        "
                f"{b[:, m].mean():.3f} ± {b[:, m].std():.3f}    {a[:, m].mean() - b[:, m].mean():+.3f}"
                f"          {np.mean(secs):.1f}"
            )


if __name__ == "__main__":
    main()
