"""The dashboard in a real browser: headless Chromium (Debian's) driven by Playwright.

``CROWDTALLY_DASHBOARD_PNG=docs/dashboard.png python3 -m pytest -n0 tests/app/test_dashboard.py``
also writes the documentation's screenshot (1200 x 900, while labels arrive)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from app.io.triples import read_triples
from app.testing import wait_healthy
from tests.app.conftest import ADMIN

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DOCS_PNG = os.environ.get("CROWDTALLY_DASHBOARD_PNG")
# short intervals: counters every 0.25 s, the rate over the last second, the rest every second
FAST = "poll=0.25&window=1&refresh=1"
DASH = "\u2013"  # the page's ranges (1–25) and its "no value"
CHARTS = {
    "throughput": ("time (seconds before now)", "throughput (labels/s)"),
    "confidence-histogram": ("probability of the most likely label", "items"),
    "label-counts": ("most likely label", "items"),
    "reliability": ("confidence (mean in bin)", "accuracy on gold"),
}


@pytest.fixture(scope="module")
def served_dog(
    tmp_path_factory: pytest.TempPathFactory, datasets_root: Path
) -> Iterator[tuple[str, str]]:
    """An embedded ``crowdtally serve`` loaded with the shared dog dataset and 40 gold items."""
    workdir = tmp_path_factory.mktemp("dashboard")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    env = {
        **os.environ,
        "CROWDTALLY_STORE": "embedded",
        "CROWDTALLY_ADMIN_KEY": ADMIN,
        "CROWDTALLY_REFINE_PASSES": "0",
        "CROWDTALLY_DATA_DIR": str(workdir),
    }
    api = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--port", str(port)], env=env, cwd=workdir
    )
    client = httpx.Client(
        base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {ADMIN}"}
    )
    try:
        wait_healthy(client, 60, api)
        triples = read_triples(datasets_root / "dog" / "answers.csv")
        classes = sorted({str(x) for x in triples.labels})
        r = client.post("/v1/projects", json={"name": "dog", "labels": classes})
        key = r.json()["api_key"]
        rows = [
            {"item": str(i), "worker": str(w), "label": str(z), "id": str(n)}
            for n, (i, w, z) in enumerate(
                zip(triples.items, triples.workers, triples.labels, strict=True)
            )
        ]
        auth = {"Authorization": f"Bearer {key}"}
        for lo in range(0, len(rows), 1000):
            client.post("/v1/projects/dog/labels", params={"wait": True},
                        content=orjson.dumps(rows[lo : lo + 1000]), headers=auth)  # fmt: skip
        truth = (datasets_root / "dog" / "truth.csv").read_text().splitlines()[1:41]
        gold = [{"item": i, "label": z} for i, z in (row.split(",") for row in truth)]
        r = client.post("/v1/projects/dog/gold", params={"wait": True}, json=gold, headers=auth)
        assert r.status_code == 202, r.text
        r = client.post("/v1/projects/dog/refit", params={"wait": True}, headers=auth)
        assert r.status_code == 202, r.text
        yield str(client.base_url), key
    finally:
        client.close()
        api.kill()
        api.wait()


def test_summary_endpoint(served_dog: tuple[str, str]) -> None:
    base, key = served_dog
    s = httpx.get(
        f"{base}/v1/projects/dog/summary", headers={"Authorization": f"Bearer {key}"}
    ).json()
    assert sum(s["confidence_histogram"]["counts"]) == s["stats"]["n_items"] == 807
    assert sum(s["label_counts"].values()) == 807
    assert len(s["workers"]) == 25
    assert len(s["queue"]) == 10 and s["queue_size"] > 10
    progress = s["queue_progress"]
    assert progress["open"] == s["queue_size"] and progress["done"] + progress["open"] <= 807
    infos = [w["informativeness"] for w in s["workers"]]
    assert infos == sorted(infos)  # least informative first
    assert all(
        abs(sum(row.values()) - 1) < 1e-9 for w in s["workers"] for row in w["confusion"].values()
    )


def texts(page: Any, selector: str) -> list[str]:
    """The text of each element (SVG text has no ``innerText``)."""
    return [str(t) for t in page.locator(selector).evaluate_all("es => es.map(e => e.textContent)")]


def rows(page: Any, table: str, attr: str) -> list[str]:
    return [str(x) for x in page.locator(f"#{table} tbody tr").evaluate_all(
        f"trs => trs.map(tr => tr.dataset.{attr})")]  # fmt: skip


def shows(page: Any, table: str, text: str) -> None:
    """Wait until the pager of ``table`` (workers or items) reads ``text``."""
    page.wait_for_function(f"$('{table}-page').textContent === {json.dumps(text)}")


def check_plots(page: Any) -> None:
    """Every chart has both axis titles, ticks on both axes and a legend; every confusion
    heatmap has its axes titled and ticked with the class names and a colour scale."""
    for chart, (x_title, y_title) in CHARTS.items():
        svg = f"svg#{chart}"
        assert texts(page, f"{svg} .axis-title.x") == [x_title], chart
        assert texts(page, f"{svg} .axis-title.y") == [y_title], chart
        assert page.locator(f"{svg} .axis.y text.tick").count() >= 2, chart
        assert page.locator(f"{svg} .axis.x text.tick").count() >= 2, chart
        assert all(texts(page, f"{svg} .legend text")), chart
        assert page.locator(f"{svg} .legend text").count() >= 1, chart
    assert texts(page, "svg#throughput .legend text") == ["labels/s, mean of the last 1 s"]
    heatmaps = page.locator("svg.heatmap")
    assert heatmaps.count() == 25
    per_map = heatmaps.evaluate_all("""maps => maps.map(m => [
        m.querySelector('.axis-title.y').textContent, m.querySelector('.axis-title.x').textContent,
        [...m.querySelectorAll('.axis.y .tick')].map(t => t.textContent).join(),
        [...m.querySelectorAll('.axis.x .tick')].map(t => t.textContent).join(),
        [...m.querySelectorAll('.legend .tick')].map(t => t.textContent).join(),
        m.querySelector('.legend-title').textContent, m.querySelectorAll('rect.cell').length])""")
    expected = ["true label", "answered label", "0,1,2,3", "0,1,2,3", "0,0.5,1", "P(answer | true)"]
    assert all(m == [*expected, 16] for m in per_map), per_map[0]
    # every text inside its picture, for 2 to 12 classes (with 2, the colour scale's title
    # ran past the top and the bottom)
    outside = page.evaluate("""() => [2, 3, 4, 7, 10, 12].flatMap(k => {
        const labels = [...Array(k).keys()].map(i => k > 7 ? `class ${i}` : String(i));
        const matrix = Object.fromEntries(labels.map(t => [t, Object.fromEntries(
            labels.map(a => [a, t === a ? 0.9 : 0.1 / (k - 1)]))]));
        const svg = document.body.appendChild(heatmap(matrix, labels));
        const box = svg.getBoundingClientRect();
        const out = [...svg.querySelectorAll('text')].map(t => t.getBoundingClientRect())
            .filter(r => r.top < box.top - 0.5 || r.bottom > box.bottom + 0.5
                         || r.left < box.left - 0.5 || r.right > box.right + 0.5);
        svg.remove();
        return out.length ? [k] : [];
    })""")
    assert outside == [], f"texts past the heatmap's edges with these numbers of classes: {outside}"


def post_labels(base: str, key: str, stop: threading.Event) -> None:
    """New items labelled by the dog workers, 20 labels every 50 ms until ``stop``."""
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}) as c:
        n = 0
        while not stop.is_set():
            block = [{"item": f"live-{n + j}", "worker": str(j % 10 + 1), "label": str(j % 4)}
                     for j in range(20)]  # fmt: skip
            assert c.post("/v1/projects/dog/labels", content=orjson.dumps(block)).status_code == 202
            n += 20
            time.sleep(0.05)


def test_dashboard_in_headless_chromium(served_dog: tuple[str, str]) -> None:
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail("Chromium is not installed (apt-get install chromium; .ci/run does it)")
    base, key = served_dog
    auth = {"Authorization": f"Bearer {key}"}
    ranked = httpx.get(f"{base}/v1/projects/dog/workers", headers=auth,
                       params={"order": "worst", "limit": 1000}).json()  # fmt: skip
    names = [w["worker"] for w in ranked["workers"]]
    assert ranked["total"] == len(names) == 109
    first = httpx.get(f"{base}/v1/projects/dog/items", params={"limit": 50}, headers=auth).json()
    second = httpx.get(f"{base}/v1/projects/dog/items", headers=auth,
                       params={"limit": 50, "cursor": first["next_cursor"]}).json()  # fmt: skip
    page1, page2 = ([x["item"] for x in p["items"]] for p in (first, second))
    assert len(page1) == len(page2) == 50 and not set(page1) & set(page2)
    ARTIFACTS.mkdir(exist_ok=True)
    stop = threading.Event()
    poster = threading.Thread(target=post_labels, args=(base, key, stop), daemon=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"],
        )  # fmt: skip
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.set_default_timeout(10_000)
            missing: list[str] = []  # the page's own files (and its icon) that did not load
            page.on("response", lambda r: missing.append(r.url)
                    if r.status >= 400 and "/v1/" not in r.url else None)  # fmt: skip
            page.goto(f"{base}/dashboard/?project=dog&key={key}&{FAST}")
            page.wait_for_selector("svg.heatmap")
            page.wait_for_selector("#reliability circle")  # the calibration on the 40 gold items
            page.wait_for_selector("#throughput path", state="attached")  # two samples: a line
            assert page.locator("#confidence-histogram .plot rect.bar").count() == 20
            assert page.locator("#n-items").inner_text() == "807"
            assert "8,070" in page.locator("#n-labels").inner_text()
            assert "project dog" in page.locator("#status").inner_text()
            assert page.locator("#last-refit").inner_text() == "adopted"  # all of dog's answers
            assert "% of its labels as served" in page.locator("#last-refit-name").inner_text()
            assert page.locator("#queue tbody tr").count() == 10  # the first of the queue
            assert "items still need labels" in page.locator("#queue-size").inner_text()
            assert "items finished, expected" in page.locator("#queue-progress").inner_text()
            assert "40 gold items: ECE" in page.locator("#calibration-text").inner_text()
            check_plots(page)

            # workers: every one reachable, page by page, in the API's order
            assert rows(page, "workers", "worker") == names[:25]
            shows(page, "workers", f"workers 1{DASH}25 of 109")
            page.click("#workers-next")
            shows(page, "workers", f"workers 26{DASH}50 of 109")
            assert rows(page, "workers", "worker") == names[25:50]
            assert page.locator("#workers tbody tr").first.locator("td.rank").inner_text() == "26"
            assert page.locator("#workers svg.heatmap").count() == 25
            for _ in range(3):
                page.click("#workers-next")
            shows(page, "workers", f"workers 101{DASH}109 of 109")
            assert rows(page, "workers", "worker") == names[100:]
            assert page.locator("#workers-next").is_disabled()
            page.click("#workers-prev")
            shows(page, "workers", f"workers 76{DASH}100 of 109")
            # ... or found by id
            page.fill("#workers-search", names[90])
            page.press("#workers-search", "Enter")
            shows(page, "workers", f"worker {names[90]}")
            assert rows(page, "workers", "worker") == [names[90]]
            assert page.locator("#workers svg.heatmap rect.cell").count() == 16
            page.fill("#workers-search", "nobody")
            page.press("#workers-search", "Enter")
            page.wait_for_function("$('workers-page').textContent.startsWith('no worker')")
            assert page.locator("#workers tbody tr").count() == 0
            page.click("#workers-all")
            shows(page, "workers", f"workers 76{DASH}100 of 109")

            # items: the stored posteriors page by page (and back), or one by id
            assert rows(page, "items", "item") == page1
            page.click("#items-next")
            page.wait_for_function("$('items-page').textContent.startsWith('page 2:')")
            assert rows(page, "items", "item") == page2
            page.click("#items-prev")
            page.wait_for_function("$('items-page').textContent.startsWith('page 1:')")
            assert rows(page, "items", "item") == page1
            page.fill("#items-search", page2[-1])
            page.press("#items-search", "Enter")
            shows(page, "items", f"item {page2[-1]}")
            assert rows(page, "items", "item") == [page2[-1]]
            page.click("#items-all")
            page.wait_for_function("$('items-page').textContent.startsWith('page 1:')")
            # bounds typed past [0, 1] are read as its ends (the API's 422 left the rows stale,
            # unsaid): from 1.5 to 2 is the 40 gold items, served at probability 1
            page.fill("#items-min", "1.5")
            page.fill("#items-max", "2")
            page.press("#items-max", "Tab")
            shows(page, "items", "page 1: 40 items")
            assert page.locator("#items tbody tr").count() == 40
            assert "error" not in (page.locator("#status").get_attribute("class") or "")
            page.fill("#items-min", "0")
            page.fill("#items-max", "1")
            page.press("#items-max", "Tab")
            page.wait_for_function("$('items-page').textContent === 'page 1: 50 items'")
            for _ in range(3):
                page.click("#workers-prev")
            shows(page, "workers", f"workers 1{DASH}25 of 109")
            page.screenshot(path=str(ARTIFACTS / "dashboard-dog.png"), full_page=True)

            # the throughput: 0 when nothing arrives, up while labels arrive, 0 again after
            rate = "+$('rate').dataset.rate"
            page.wait_for_function(f"$('rate').dataset.rate !== '' && {rate} === 0")
            poster.start()
            page.wait_for_function(f"{rate} > 20")
            if DOCS_PNG:
                page.evaluate("window.scrollTo(0, 0)")
                page.wait_for_timeout(1500)  # a few seconds of the line for the picture
                page.screenshot(path=DOCS_PNG)
            stop.set()
            poster.join()
            page.wait_for_function(f"$('rate').dataset.rate !== '' && {rate} === 0")
            assert page.locator("#rate").inner_text() == "0.0"

            # an item named ".." cannot be asked for from a browser (it resolves the step, even
            # encoded, and the page showed the project as an error): it says so
            page.fill("#items-search", "..")
            page.press("#items-search", "Enter")
            shows(page, "items", 'a browser cannot ask for an item named ".." (it reads it as '
                  "a step of the URL): use the API")  # fmt: skip
            page.click("#items-all")

            # a wrong key is reported, not a blank page
            page.goto(f"{base}/dashboard/?project=dog&key=wrong&{FAST}")
            page.wait_for_selector("#status.error")
            assert "not known" in page.locator("#status").inner_text()
            assert page.locator("#rate").inner_text() == DASH
            # a browser asked for /favicon.ico, a 404 each visit: the page names its icon
            icon = page.evaluate("document.querySelector('link[rel=icon]').href")
            assert httpx.get(icon).headers["content-type"] == "image/svg+xml"
            assert missing == [], missing
        finally:
            stop.set()
            browser.close()
    assert (ARTIFACTS / "dashboard-dog.png").stat().st_size > 10_000
