"""``ship.readback.shows``: an update read back as a JSON store may keep it
is taken as landed; one that did not land is not."""

from __future__ import annotations

from typing import Any

import pytest

from primeruns.ship.readback import shows

_SENT = {
    "avg_reward": 0.25,
    "n": 5,
    "big": 2**62 + 1,
    "by_env": {"a": 1, "x": None},
    "l": [1, None],
}


@pytest.mark.parametrize(
    "stored",
    [
        _SENT,
        {"avg_reward": 0.25, "n": 5.0, "big": float(2**62 + 1), "by_env": {"a": 1.0}, "l": [1.0]},
        {"l": [1], "by_env": {"x": None, "a": 1}, "big": 2**62 + 1, "n": 5, "avg_reward": 0.25},
        {**_SENT, "prime_runs": {"traces_episodes_written": 5}},  # a key of the store's
    ],
)
def test_a_value_a_json_store_normalised_shows_what_was_sent(stored: Any) -> None:
    assert shows(stored, _SENT)


@pytest.mark.parametrize(
    "stored",
    [
        {},  # nothing landed
        {**_SENT, "avg_reward": 0.5},  # an earlier summary
        {**_SENT, "n": "5"},
        {**_SENT, "by_env": {"a": True}},
        {**_SENT, "l": [1, 2]},
        {**_SENT, "by_env": None},
    ],
)
def test_a_value_that_is_not_what_was_sent_does_not_show_it(stored: Any) -> None:
    assert not shows(stored, _SENT)


@pytest.mark.parametrize(
    ("stored", "sent"),
    [
        (1_000_000, 1_000_001),  # a counter one apart: an earlier summary's
        (1_000_000.0, 1_000_001),  # ... kept as a double
        (16_777_216, 16_777_217),
    ],
)
def test_an_integer_read_back_as_another_does_not_show_it(stored: Any, sent: Any) -> None:
    # Within 1e-6 relative, a counter of a million and one read back as the
    # million of an earlier summary was taken as landed, and the swallowed
    # update never sent again. A double holds every such integer exactly.
    assert not shows({"episodes": stored}, {"episodes": sent})
