"""Bodies of the key-management answers: a project's keys (never their secrets) and a rotated
admin key. (Beside ``schemas``, at its level: it imports nothing of the API.)"""

from __future__ import annotations

from pydantic import BaseModel, Field


class KeyInfo(BaseModel):
    key_id: str = Field(description="Public identifier of the key (a prefix of its hash).")
    scope: str
    project: str | None
    created_at: str | None = Field(
        None,
        description="When the key was issued (ISO 8601); null for keys issued before it was recorded.",
    )


class AdminKeyRotated(BaseModel):
    api_key: str = Field(description="The new admin key; shown only once.")
    key_id: str
    revoked: list[str] = Field(description="key_id of every admin key revoked by the rotation.")
