"""The README's walk-through, run as written against a started ``crowdtally serve``: the
quickstart, calibration, the queue, predictions, import and export, the dashboard, and the
Python client's example from docs/client.md. The README cannot drift from the code."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.testing import running_service

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
WALK_THROUGH = (
    "Quickstart",
    'How sure is "95%"?',
    "Where to spend the next labels",
    "What would this worker answer?",
    "Import, export, Python client",
)


def section(title: str, text: str = README) -> str:
    parts = re.split(r"^## ", text, flags=re.MULTILINE)
    found = [p for p in parts if p.startswith(title + "\n")]
    assert found, f"README has no section {title!r}"
    return found[0]


def blocks(title: str, lang: str, text: str = README) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", section(title, text), re.S | re.M)


def json_values(out: str) -> list[Any]:
    """Every JSON object in a stream of curl answers and command output."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while (at := out.find("{", at)) >= 0:
        try:
            value, end = decoder.raw_decode(out, at)
        except json.JSONDecodeError:
            at += 1
            continue
        found.append(value)
        at = end
    return found


@pytest.mark.slow
def test_readme_walk_through(tmp_path: Path, datasets_root: Path) -> None:
    run = tmp_path / "run"
    (run / "crowdtally-data").mkdir(parents=True)
    with running_service(run / "crowdtally-data", {}) as url:
        script = "set -euo pipefail\n" + "\n".join(
            block for title in WALK_THROUGH for block in blocks(title, "bash")
        )
        script = script.replace("localhost:8000", url.removeprefix("http://"))
        script = script.replace("../shared/datasets", str(datasets_root))
        env = {**os.environ, "CROWDTALLY_URL": url, "COLUMNS": "100"}
        out = subprocess.run(
            ["bash", "-c", script], cwd=run, env=env, capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        check_answers(out.stdout)
        check_refined(url, json.loads((run / "project.json").read_text())["api_key"])
        page = httpx.get(f"{url}/dashboard/", timeout=10)
        assert page.status_code == 200 and "<html" in page.text.lower()
        run_client_example(url, (run / "crowdtally-data" / "admin.key").read_text().strip())


def check_answers(out: str) -> None:
    """The answers the README shows are the answers the service gives."""
    answers = json_values(out)
    shown = blocks("Quickstart", "json")[0]
    post = json_values(shown)[0]
    assert post in answers  # {"accepted":5,"duplicates":0,"position":1,"applied":true}
    item = {  # the second answer is abridged: its fields one by one
        k: json.loads(re.search(rf'"{k}":("[^"]*"|[0-9.]+)', shown)[1])  # type: ignore[index]
        for k in ("item", "label", "probability", "n_labels", "position")
    }
    got = next(a for a in answers if a.get("item") == item["item"] and "posterior" in a)
    assert got["label"] == item["label"] and got["n_labels"] == item["n_labels"]
    if got["position"] == item["position"]:  # before the idle sweeps: the figure shown
        assert abs(got["probability"] - item["probability"]) < 1e-9
    refined = float(re.search(r"refined posterior \(asian (0\.\d+)\)", README)[1])  # type: ignore[index]
    # the figure shown (as above, to the 9th decimal: a read may recompute it from the stored
    # rows), or the one after the idle sweeps
    shown_or_refined = abs(got["probability"] - item["probability"]) < 1e-9
    assert shown_or_refined or abs(got["probability"] - refined) < 5e-3
    queue = next(a for a in answers if "items" in a and isinstance(a["items"], list))
    assert {q["item"] for q in queue["items"]} <= {"img1", "img2", "img3", "img4"}
    settings = [a for a in answers if "max_labels_per_item" in a]  # PUT answers what is in force
    assert settings == [{"policy": "voi", "target_confidence": 0.95, "max_labels_per_item": 7,
                         "budget": None}]  # fmt: skip
    predicted = next(a for a in answers if "predictions" in a)["predictions"][0]
    shown_prediction = json_values(blocks("What would this worker answer?", "json")[0])[0]
    assert predicted.keys() == shown_prediction["predictions"][0].keys()
    assert (predicted["worker"], predicted["item"]) == ("cat", "img2")
    assert "8,070 new" in out and "807 gold" in out  # the import, then the import with gold
    accuracy = float(re.search(r"accuracy (\d+\.\d+)%", out)[1])  # type: ignore[index]
    claimed = float(re.search(r"on dog: accuracy about (\d+)%", README)[1])  # type: ignore[index]
    assert abs(accuracy - claimed) < 1.5, (accuracy, claimed)


def check_refined(url: str, key: str) -> None:
    """The refined posterior the README quotes is what img1 settles at after the sweeps (to
    5e-3: the later sections' entries move it a little more)."""
    refined = float(re.search(r"refined posterior \(asian (0\.\d+)\)", README)[1])  # type: ignore[index]
    seen: list[tuple[int, float]] = []
    for _ in range(40):  # until two reads 0.5 s apart agree, past the first position
        got = httpx.get(f"{url}/v1/projects/faces/items/img1", timeout=10,
                        headers={"Authorization": f"Bearer {key}"}).json()  # fmt: skip
        seen.append((got["position"], got["probability"]))
        if len(seen) > 1 and seen[-1] == seen[-2] and seen[-1][0] > 1:
            break
        time.sleep(0.5)
    assert seen[-1][0] > 1 and abs(seen[-1][1] - refined) < 5e-3, (seen[-3:], refined)


def run_client_example(url: str, admin_key: str) -> None:
    """docs/client.md's example, on a project of its own (the README's has the same name)."""
    client_doc = (REPO / "docs" / "client.md").read_text(encoding="utf-8")
    code = blocks("The Python client (`clients/python`, distribution `crowdtally-client`)",
                  "python", client_doc)[0]  # fmt: skip
    code = code.replace('"faces"', '"faces_py"').replace("http://127.0.0.1:8000", url)
    env = {**os.environ, "PYTHONPATH": str(REPO / "clients" / "python" / "src")}
    out = subprocess.run(
        [sys.executable, "-c", f"ADMIN_KEY = {admin_key!r}\n{code}"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[0] == "2 0 1"  # accepted, duplicates, blocks


def test_readme_extract_example_prints_what_the_readme_shows(datasets_root: Path) -> None:
    """The `crowdtally extract` example's output, line for line, but the timing line and the
    table's elided rows."""
    shown = blocks("`crowdtally extract`", "text")[0].splitlines()
    command = shown[0].removeprefix("$ ").replace("../shared/datasets", str(datasets_root))
    args = command.split()[1:]
    out = subprocess.run(
        [sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    printed = out.stdout.splitlines()
    for line in shown[4:]:  # (after the command, the settings line and the table's header)
        if line == "..." or line.startswith("online EM:"):
            continue
        assert line in printed, (line, printed[-10:])
    raw = subprocess.run(
        [sys.executable, "-m", "app.cli", *args, "--raw"], capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    ece, nll = re.search(
        r"on dog above: ECE (\d+\.\d+) points, NLL (\d+\.\d+) nats", README
    ).groups()  # type: ignore[union-attr]
    got = re.search(r"ECE (\d+\.\d+) points, NLL (\d+\.\d+) nats", raw.stdout)
    assert got is not None, raw.stdout[-300:]
    assert (got[1], round(float(got[2]), 2)) == (ece, float(nll)), raw.stdout[-300:]
