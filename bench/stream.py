"""Stream each shared dataset through the HTTP API and compare with the core engine.

``python -m bench.stream [--store embedded|redis] [--datasets dog,web]`` posts every dataset's
answers in random order, in blocks of 100 to 1,000 labels, through the API (engine in process,
on the chosen store), lets the engine run its refinement sweeps, then reads the served
posteriors back and prints their accuracy beside the core engine's on the very same stream
(``core_on_stream``, written with ``core.online`` directly, independently of ``app.engine``).
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from app.io.extract import Encoded, accuracy, load_labelled
from bench.datasets import DEFAULT_ROOT, dataset_names
from core.blocks import FloatArray, IntArray, LabelBlocks, canonical_order
from core.calibration import choose
from core.hashing import worker_slot
from core.nominal import NominalConfig
from core.online import BlockResult, OnlineEM
from core.served import held_out_fit


@dataclass(frozen=True)
class Stream:
    """A dataset's answers in one random order, cut into blocks (index ranges into order)."""

    data: Encoded
    gold: np.ndarray
    order: np.ndarray
    cuts: list[tuple[int, int]]

    def blocks(self) -> Iterator[list[dict[str, Any]]]:
        d = self.data
        items, workers = d.item_ids[d.items].tolist(), d.worker_ids[d.workers].tolist()
        for lo, hi in self.cuts:
            yield [
                {
                    "item": items[n],
                    "worker": workers[n],
                    "label": d.classes[d.labels[n]],
                    "id": str(n),
                }
                for n in self.order[lo:hi].tolist()
            ]


def make_stream(folder: Path, seed: int = 0, smallest: int = 100, largest: int = 1000) -> Stream:
    data, gold = load_labelled(folder)
    rng = np.random.default_rng(seed)
    order = rng.permutation(data.items.size)
    cuts, lo = [], 0
    while lo < order.size:
        hi = min(order.size, lo + int(rng.integers(smallest, largest + 1)))
        cuts.append((lo, hi))
        lo = hi
    return Stream(data, gold, order, cuts)


def core_on_stream(stream: Stream, config: NominalConfig, passes: int) -> FloatArray:
    """Posteriors (by item code) from core.OnlineEM fed the same arrivals as the service:
    per block, each item's new labels (canonical order) after its earlier ones, the block's
    items in first-appearance order; then ``passes`` refinement passes over all items
    (first-seen order), each label counted once; then posteriors under the final parameters,
    each item held out (eq. 26) after the passes, calibrated as served (eq. 21). One ``learn_many`` call takes a block's items
    one after the other, as that many calls of one item each would."""
    d, K = stream.data, config.n_classes
    model = OnlineEM(config, pooled_twin=True)  # with its pooled twin, as the engine's (eq. 29)
    slot_of = np.array([worker_slot(w, config.n_worker_slots) for w in d.worker_ids.tolist()])
    labels: dict[int, tuple[list[int], list[int]]] = {}
    last: dict[int, tuple[FloatArray, float]] = {}
    twin: dict[int, tuple[FloatArray, float]] = {}  # the twin's, while it learns
    for lo, hi in stream.cuts:
        rows = stream.order[lo:hi]
        # the block's items in first-appearance order, each item's labels in canonical order
        uniq, first, inverse = np.unique(d.items[rows], return_index=True, return_inverse=True)
        arrival = np.argsort(first, kind="stable")
        rank = np.empty_like(arrival)
        rank[arrival] = np.arange(arrival.size)
        s, z = slot_of[d.workers[rows]], d.labels[rows]
        o = canonical_order(rank[inverse.ravel()], s, z, np.ones(rows.size))
        bounds = np.cumsum([0, *np.bincount(rank[inverse.ravel()]).tolist()]).tolist()
        s_sorted, z_sorted = s[o].tolist(), z[o].tolist()
        items = uniq[arrival].tolist()
        n_prev = []
        for k, item in enumerate(items):
            old_s, old_z = labels.setdefault(item, ([], []))
            n_prev.append(len(old_s))
            old_s.extend(s_sorted[bounds[k] : bounds[k + 1]])
            old_z.extend(z_sorted[bounds[k] : bounds[k + 1]])
        _learn(model, items, labels, n_prev, last, twin, K)
    everything = list(labels)
    sizes = [len(labels[item][0]) for item in everything]
    if passes:  # as the engine's sweep starts: the labelling, then the model in the lead
        _follow(last, model.orient())
        _follow(twin, model.twin_relabelled)
        if model.lead():
            last, twin = twin, last
    for _ in range(passes):
        _learn(model, everything, labels, sizes, last, twin, K)
    out = np.full((d.n_items, K), 1.0 / K)
    served = choose(model.params.evidence)
    blocks = _blocks(everything, labels)
    raw = model.predict_many(blocks).posteriors
    if passes:  # the sweeps fit the rows to every item: each served held out (eq. 26)
        config = model.config
        raw = held_out_fit(
            model.params,
            blocks,
            raw,
            config.worker_prior,
            population_precision=config.population_precision(),
        )
    out[everything] = served.from_posteriors(raw, np.asarray(sizes, dtype=np.float64))
    return out


def _blocks(items: list[int], labels: dict[int, tuple[list[int], list[int]]]) -> LabelBlocks:
    """The items' labels, one block each."""
    s = [x for item in items for x in labels[item][0]]
    z = [x for item in items for x in labels[item][1]]
    ptr = np.cumsum([0, *(len(labels[item][0]) for item in items)])
    return LabelBlocks(ptr, np.array(s, dtype=np.int64), np.array(z), np.ones(len(s)))


def _learn(
    model: OnlineEM,
    items: list[int],
    labels: dict[int, tuple[list[int], list[int]]],
    n_prev: list[int],
    last: dict[int, tuple[FloatArray, float]],
    twin: dict[int, tuple[FloatArray, float]],
    K: int,
) -> None:
    """Learn the items' labels (each after its ``n_prev`` earlier ones), in this order; the
    twin's kept posteriors ``twin`` too, while it learns."""
    start = (np.full(K, 1.0 / K), 0.0)

    def kept(posteriors: dict[int, tuple[FloatArray, float]]) -> BlockResult:
        return BlockResult(
            np.array([posteriors.get(item, start)[0] for item in items]),
            np.array([posteriors.get(item, start)[1] for item in items]),
            np.zeros(len(items)),
        )

    learning = model.twin is not None
    res = model.learn_many(
        _blocks(items, labels), previous=kept(last), n_previous=n_prev,
        twin_previous=kept(twin) if learning else None,
    )  # fmt: skip
    _follow(twin, model.twin_relabelled)  # the kept posteriors follow, as the engine's
    if model.took_twin:
        last.clear()
        last.update(twin)
    _follow(last, model.relabelled)
    for n, item in enumerate(items):
        last[item] = res.posteriors[n], float(res.clarity[n])
    if model.twin_out is not None:
        for n, item in enumerate(items):
            twin[item] = model.twin_out.posteriors[n], float(model.twin_out.clarity[n])
    elif learning:  # settled
        twin.clear()


def _follow(kept: dict[int, tuple[FloatArray, float]], perm: IntArray | None) -> None:
    """Kept posteriors follow a relabelling of the classes."""
    if perm is not None:
        for item, (q, b) in kept.items():
            kept[item] = q[perm], b


SETTLE_S = 0.5
"""How long the log must stay still, applied to its end, for a refinement sweep to be over."""


def serve_stream(
    client: Any,
    stream: Stream,
    project: str,
    timeout_s: float = 300.0,
    dyadic: bool = True,
    posted: Callable[[], None] | None = None,
) -> FloatArray:
    """Post the stream through an API client (httpx/TestClient, admin headers set), wait for
    the engine (refinement included), and return the served posteriors by item code. With
    ``dyadic`` False the project has no dyadic model (it does not touch the posteriors);
    ``posted`` is called once every block is posted."""
    d = stream.data
    body: dict[str, Any] = {"name": project, "labels": list(d.classes)}
    if not dyadic:
        body["dyadic"] = {"enabled": False}
    r = client.post("/v1/projects", json=body)
    r.raise_for_status()
    key = {"Authorization": f"Bearer {r.json()['api_key']}"}
    for block in stream.blocks():
        url, content = f"/v1/projects/{project}/labels", orjson.dumps(block)
        r = client.post(url, content=content, headers=key)
        while r.status_code == 429:  # the engine lags: push-back, as the Python client honours it
            time.sleep(float(r.headers.get("Retry-After", "1")))
            r = client.post(url, content=content, headers=key)
        r.raise_for_status()
    if posted is not None:
        posted()
    deadline = time.monotonic() + timeout_s
    refined = False
    # The sweep's slices are logged one after another, each once the one before is applied:
    # it is over when the log, with the engine at its end, has not moved for SETTLE_S.
    still: tuple[int, float] = (-1, 0.0)  # log end, and since when the engine is there
    while time.monotonic() < deadline:
        stats = client.get(f"/v1/projects/{project}", headers=key).json()["stats"]
        entries, now = stats["log_end"], time.monotonic()
        at_end = entries > len(stream.cuts) and stats["applied"] == entries
        still = (entries, still[1] if at_end and still[0] == entries else now)
        refined = at_end and now - still[1] >= SETTLE_S
        if refined:
            break
        time.sleep(0.05)
    if not refined:
        raise TimeoutError(f"{project}: the engine did not finish its refinement sweeps")
    code = {name: n for n, name in enumerate(d.item_ids.tolist())}
    out = np.full((d.n_items, len(d.classes)), 1.0 / len(d.classes))
    text = client.get(f"/v1/projects/{project}/export", headers=key).text
    for line in text.splitlines():
        row = orjson.loads(line)
        out[code[row["item"]]] = [row["posterior"][c] for c in d.classes]
    client.delete(f"/v1/projects/{project}")
    return out


def main() -> None:
    from fastapi.testclient import TestClient

    from app.api import create_app
    from app.settings import Settings

    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--store", default="embedded", choices=["embedded", "redis"])
    ap.add_argument("--datasets", default=None, help="comma-separated names (default: all)")
    ap.add_argument("--passes", type=int, default=3, help="refinement sweeps (the service default)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    names = args.datasets.split(",") if args.datasets else dataset_names(DEFAULT_ROOT)
    tmp = Path(f"/tmp/crowdtally-stream-{uuid.uuid4().hex[:8]}")
    settings = Settings(
        store=args.store, data_dir=tmp, admin_key="bench", refine_passes=args.passes,
        refine_idle_s=0.2, redis_prefix=f"bench-stream-{uuid.uuid4().hex[:8]}",
    )  # fmt: skip
    print(f"store={args.store}  blocks of 100-1000 labels, random order, seed {args.seed}, "
          f"{args.passes} refinement sweeps")  # fmt: skip
    print(
        f"{'dataset':<20}{'labels':>8}{'blocks':>8}{'service':>10}{'core':>10}{'diff':>8}{'secs':>7}"
    )
    with TestClient(create_app(settings), headers={"Authorization": "Bearer bench"}) as client:
        diffs = []
        for name in names:
            stream = make_stream(DEFAULT_ROOT / name, args.seed)
            t0 = time.perf_counter()
            served = serve_stream(client, stream, f"stream-{name}")
            secs = time.perf_counter() - t0
            cfg = NominalConfig(n_classes=len(stream.data.classes))
            core = core_on_stream(stream, cfg, args.passes)
            a_served = 100 * accuracy(served.argmax(axis=1), stream.gold)[0]
            a_core = 100 * accuracy(core.argmax(axis=1), stream.gold)[0]
            diffs.append(abs(a_served - a_core))
            print(f"{name:<20}{stream.data.items.size:>8}{len(stream.cuts):>8}{a_served:>10.2f}"
                  f"{a_core:>10.2f}{a_served - a_core:>+8.2f}{secs:>7.1f}")  # fmt: skip
        print(f"largest |service - core|: {max(diffs):.2f} points (target <= 0.1)")


if __name__ == "__main__":
    main()
