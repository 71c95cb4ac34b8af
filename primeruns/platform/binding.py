"""The platform run a journal ships to, once registered: what the lifecycle
records in the journal's meta and every sink addresses its requests to."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Binding"]


@dataclass(frozen=True)
class Binding:
    """The platform run a journal ships to, once registered."""

    run_id: str
    kind: str  # "eval" | "train"
    url: str | None = None
