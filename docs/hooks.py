"""mkdocs hook: the home page is the README, whose links are relative to the repository root.

docs/index.md holds only the line `--8<-- "README.md"`; this hook puts the README there itself
so that its links to `docs/X.md` (right on GitHub and in a checkout) become `X.md`, the page's
neighbours on the site. The snippets extension would include it after the links are checked.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

_README = Path(__file__).resolve().parents[1] / "README.md"
_INCLUDE = '--8<-- "README.md"'
_DOC_LINK = re.compile(r"\]\(docs/")


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri != "index.md":
        return markdown
    readme = _DOC_LINK.sub("](", _README.read_text(encoding="utf-8"))
    return markdown.replace(_INCLUDE, readme)
