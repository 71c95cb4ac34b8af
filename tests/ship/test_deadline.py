"""The close-out's budget read from a finish entry, which is untrusted input."""

from __future__ import annotations

import math

import pytest

from primeruns.ship.deadline import K_AT_BOOT, boot_clock, budget_left


@pytest.mark.parametrize("timeout", [math.nan, math.inf, -math.inf, 10**400, "30", True, None])
def test_a_finish_entry_whose_timeout_is_not_a_finite_number_gets_the_default_budget(
    timeout: object,
) -> None:
    """NaN compared false with every bound, so it read as 0 and the uplink
    closed the run out at once with its records unshipped; an infinity
    made a deadline no wait can take."""
    assert budget_left({"timeout": timeout}, 60.0) == 60.0
    assert budget_left({"timeout": timeout, K_AT_BOOT: boot_clock()}, 60.0) == 60.0


def test_a_negative_timeout_leaves_no_budget_and_a_finite_one_counts_from_the_finish() -> None:
    assert budget_left({"timeout": -5.0}, 60.0) == 0.0
    left = budget_left({"timeout": 100.0, K_AT_BOOT: boot_clock() - 30.0}, 60.0)
    assert 0.0 < left <= 70.0


def test_a_finish_stamped_on_a_clock_that_is_not_a_number_counts_from_the_read() -> None:
    assert budget_left({"timeout": 100.0, K_AT_BOOT: math.nan}, 60.0) == 100.0
