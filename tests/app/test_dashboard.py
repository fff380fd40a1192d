"""The dashboard in a real browser: headless Chromium (Debian's) driven by Playwright."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from app.io.triples import read_triples
from tests.app.test_processes import Layout

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture
def served_dog(tmp_path: Path, datasets_root: Path) -> Iterator[tuple[str, str]]:
    """An embedded ``crowdtally serve`` loaded with the shared dog dataset."""
    lay = Layout(tmp_path, CROWDTALLY_STORE="embedded")
    lay.kill_engine()  # the embedded server runs its engine in process
    lay.api.kill()
    lay.api.wait()
    lay.api = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--port", str(lay.client.base_url.port)],
        env=lay.env,
        cwd=tmp_path,
    )
    try:
        lay.wait_ready()
        triples = read_triples(datasets_root / "dog" / "answers.csv")
        classes = sorted({str(x) for x in triples.labels})
        r = lay.client.post("/v1/projects", json={"name": "dog", "labels": classes})
        key = r.json()["api_key"]
        rows = [
            {"item": str(i), "worker": str(w), "label": str(z), "id": str(n)}
            for n, (i, w, z) in enumerate(
                zip(triples.items, triples.workers, triples.labels, strict=True)
            )
        ]
        for lo in range(0, len(rows), 1000):
            lay.client.post("/v1/projects/dog/labels", params={"wait": True}, content=orjson.dumps(rows[lo : lo + 1000]),
                            headers={"Authorization": f"Bearer {key}"})  # fmt: skip
        truth = (datasets_root / "dog" / "truth.csv").read_text().splitlines()[1:41]
        gold = [{"item": i, "label": z} for i, z in (row.split(",") for row in truth)]
        r = lay.client.post("/v1/projects/dog/gold", params={"wait": True}, json=gold,
                            headers={"Authorization": f"Bearer {key}"})  # fmt: skip
        assert r.status_code == 202, r.text
        yield str(lay.client.base_url), key
    finally:
        lay.close()


def test_summary_endpoint(served_dog: tuple[str, str]) -> None:
    base, key = served_dog
    s = httpx.get(
        f"{base}/v1/projects/dog/summary", headers={"Authorization": f"Bearer {key}"}
    ).json()
    assert sum(s["confidence_histogram"]["counts"]) == s["stats"]["n_items"] == 807
    assert sum(s["label_counts"].values()) == 807
    assert len(s["workers"]) == 25
    assert len(s["queue"]) == 10 and s["queue_size"] > 10
    infos = [w["informativeness"] for w in s["workers"]]
    assert infos == sorted(infos)  # least informative first
    assert all(
        abs(sum(row.values()) - 1) < 1e-9 for w in s["workers"] for row in w["confusion"].values()
    )


def test_dashboard_in_headless_chromium(served_dog: tuple[str, str]) -> None:
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail("Chromium is not installed (apt-get install chromium; .ci/run does it)")
    base, key = served_dog
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"],
        )  # fmt: skip
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{base}/dashboard/?project=dog&key={key}")
            page.wait_for_selector("svg.heatmap", timeout=20_000)
            page.wait_for_timeout(2500)  # a second sample for the throughput line
            assert page.locator("svg.heatmap").count() == 25
            assert page.locator("svg.heatmap").first.locator("rect").count() == 16  # 4 x 4 classes
            assert page.locator("#confidence-histogram rect").count() == 20
            assert page.locator("#n-items").inner_text() == "807"
            assert "8,070" in page.locator("#n-labels").inner_text()
            assert "project dog" in page.locator("#status").inner_text()
            assert page.locator("#queue tbody tr").count() == 10  # the first of the queue
            assert "items still need labels" in page.locator("#queue-size").inner_text()
            page.wait_for_selector("#reliability circle")  # the calibration on the 40 gold items
            assert "40 gold items: ECE" in page.locator("#calibration-text").inner_text()
            page.screenshot(path=str(ARTIFACTS / "dashboard-dog.png"), full_page=True)
            # a wrong key is reported, not a blank page
            page.goto(f"{base}/dashboard/?project=dog&key=wrong")
            page.wait_for_selector("#status.error", timeout=10_000)
            assert "not known" in page.locator("#status").inner_text()
        finally:
            browser.close()
    assert (ARTIFACTS / "dashboard-dog.png").stat().st_size > 10_000
