"""docs/deploy.md's settings table and app/settings.py say the same: every setting is listed
under its environment variable, with the default the code has, and nothing else is listed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo

from app.settings import Settings

DEPLOY = Path(__file__).resolve().parents[1] / "docs" / "deploy.md"


def _variables(name: str, field: FieldInfo) -> set[str]:
    alias = field.validation_alias
    choices = getattr(alias, "choices", None)
    if choices:
        return {str(c) for c in choices}
    return {f"CROWDTALLY_{name.upper()}"}


def _table() -> list[tuple[list[str], list[str | None]]]:
    """(variables, defaults) per row of the "Settings (environment)" table."""
    text = DEPLOY.read_text()
    section = text.split("## Settings (environment)", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        names = re.findall(r"`([A-Z_]+)`", cells[0])
        defaults: list[str | None] = []
        for part in cells[1].split(", "):
            if part.startswith("unset"):
                defaults.append(None)
            else:
                found = re.match(r"`([^`]*)`", part)
                assert found, f"no default in {line!r}"
                defaults.append(found.group(1))
        rows.append((names, defaults))
    return rows


def _same(doc: str | None, code: Any) -> bool:
    if code is None or doc is None:
        return doc is None and code is None
    if isinstance(code, bool):
        return doc == str(code).lower()
    if isinstance(code, int | float):
        return float(doc) == float(code)
    return doc == str(code)


def test_every_setting_is_documented_with_its_default() -> None:
    fields = Settings.model_fields
    by_variable = {v: name for name, f in fields.items() for v in _variables(name, f)}
    documented: dict[str, str | None] = {}
    for names, defaults in _table():
        settings = list(dict.fromkeys(by_variable.get(n, n) for n in names))
        unknown = [s for s in settings if s not in fields]
        assert not unknown, f"docs/deploy.md lists variables that are not settings: {unknown}"
        assert len(defaults) == len(settings), (names, defaults)
        documented.update(zip(settings, defaults, strict=True))
    missing = sorted(set(fields) - set(documented))
    assert not missing, f"settings missing from docs/deploy.md: {missing}"
    wrong = {
        name: (documented[name], f.default)
        for name, f in fields.items()
        if not _same(documented[name], f.default)
    }
    assert not wrong, f"docs/deploy.md defaults differ from app/settings.py: {wrong}"
