"""``python -m app.cli``: the ``crowdtally`` command."""

from app.cli import main

main()
