"""Whether a value read back from the platform shows what the SDK sent.

An evaluation's update (its summary, its config) answered with nothing is
checked by reading the evaluation back (``Lifecycle._updated``): a
gateway's empty 200 may never have forwarded it. The contract (§2.3) says
what is sent, not how it is stored, and a JSON store is free to normalise:
an integer read back as a float (``1.0`` for ``1``; a large one rounded to
a double), keys in another order, a null or an empty object dropped, keys
of its own added beside ours. Compared with ``==``, a nested null the store
dropped, or a large integer it rounded, read as "not landed": the update
was sent again and again until the close-out's time ran out, and then
reported as failed although it had landed.

So :func:`shows` compares as JSON values, not Python objects: numbers by
value (a fraction within a relative ``1e-6``, what a store keeping single
precision or printing fewer digits loses; an integer, a count, exactly or
as the double nearest it: within ``1e-6``, an earlier summary's counter
one apart from the one sent showed it), a null or empty value sent
matching one absent, nulls dropped from a list, and keys the store added
ignored, and an object kept as JSON text decoded. A string, a boolean or
a value of another type read back must still be what was sent; one of
another shape than the object sent (a list, a number) does not show it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["shows"]

# The relative difference two numbers may have and still be the value sent.
_REL_TOL = 1e-6


def shows(stored: Any, sent: Any) -> bool:
    """Whether ``stored`` (a JSON value read back) is ``sent`` as a JSON
    store may have kept it (see the module's docstring)."""
    if isinstance(sent, Mapping):
        stored = _decoded(stored)
        if not isinstance(stored, Mapping):
            return False
        return all(
            _dropped(value) if key not in stored else shows(stored[key], value)
            for key, value in sent.items()
        )
    if isinstance(sent, list | tuple):
        if not isinstance(stored, list | tuple):
            return False
        kept = [value for value in sent if value is not None]
        found = [value for value in stored if value is not None]
        return len(kept) == len(found) and all(map(shows, found, kept))
    if isinstance(sent, bool) or isinstance(stored, bool):
        return stored is sent
    if isinstance(sent, int | float):
        return isinstance(stored, int | float) and _same_number(stored, sent)
    return bool(stored == sent)


def _decoded(stored: Any) -> Any:
    """An object a store keeps as JSON text, decoded; anything else as it is
    (text that is not JSON then shows no object)."""
    if not isinstance(stored, str):
        return stored
    try:
        return json.loads(stored)
    except ValueError:  # not JSON (json.JSONDecodeError, a ValueError)
        return stored


def _dropped(value: Any) -> bool:
    """Whether a store may leave out a key holding ``value``: a null, or an
    empty object or list."""
    return value is None or (isinstance(value, Mapping | list | tuple) and not value)


def _same_number(stored: float, sent: float) -> bool:
    if stored == sent:
        return True
    try:
        if isinstance(sent, int):
            # An integer is a count: one apart is another value, though
            # within the tolerance past a million (an earlier summary's
            # counter read back as the one sent, a swallowed update taken as
            # landed). A store keeping doubles rounds it to the nearest.
            return float(stored) == float(sent)
        return math.isclose(float(stored), float(sent), rel_tol=_REL_TOL)
    except OverflowError:  # an integer past a double's range: exact only
        return False
