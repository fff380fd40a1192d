"""The HTTP API (FastAPI, under /v1): ``create_app`` assembles one router per domain.

``main`` (the factory and its lifespan), ``deps`` (the shared ``Service`` and the key check),
``errors``, ``middleware``, ``bodies`` (JSON arrays read by hand), ``schemas``, ``views`` (the
answers' bodies), ``metrics``, ``auth`` (API keys) and ``routes/`` (one module per domain).
"""

from app.api.main import create_app

__all__ = ["create_app"]
