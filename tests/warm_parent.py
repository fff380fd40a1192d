"""Imported once by the forkserver of tests/forked.py: what ``crowdtally serve`` and
``crowdtally engine`` import and load, so that each command forked from it starts warm."""

import importlib

from app.serving import warmup

for module in ("app.cli", "app.cli.service", "app.api.main", "app.engine.runtime",
               "app.store.archive", "uvicorn"):  # fmt: skip
    importlib.import_module(module)
warmup.everything()
warmup.freeze_what_is_loaded()  # the forks' own collections need not walk it
