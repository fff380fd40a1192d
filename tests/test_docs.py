"""The docs site builds (strict: a missing page or snippet fails) and lists every doc page."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def test_mkdocs_builds_strict(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    home = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert "crowdtally serve" in home and "Quickstart" in home  # the README, included
    assert 'href="model/"' in home and 'href="docs/' not in home  # its links lead to the pages


def test_docs_speak_of_the_product() -> None:
    """No page title or sentence points at the tracker ("issue 5", "the issue's target")."""
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        assert not re.search(r"\bissue\s+\d|\bthe issue'?s?\b|\(another issue\)", text), page.name


def test_every_doc_page_is_in_the_nav() -> None:
    config = yaml.safe_load(
        (REPO / "mkdocs.yml").read_text(encoding="utf-8").replace("!!python", "#")
    )
    pages = {next(iter(item.values())) for item in config["nav"]}
    on_disk = {p.name for p in (REPO / "docs").glob("*.md")}
    assert on_disk <= pages, f"add to mkdocs.yml nav: {sorted(on_disk - pages)}"


def test_ci_runs_the_readme_s_test_command_verbatim() -> None:
    """.ci/run's last line is the README's command 2, as a newcomer types it."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    command = re.search(r"^# 2\. .*\n(.+)$", readme, re.M)
    assert command is not None, "README: no command 2"
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").rstrip("\n").splitlines()[-1]
    assert ci == command.group(1)
