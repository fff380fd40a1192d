"""Imported by the forkserver of tests/app/engine_fork.py: the engine's kernels, loaded (or
compiled) once there, so that every engine forked from it has them in memory."""

from __future__ import annotations

from app.serving.warmup import everything

everything()
