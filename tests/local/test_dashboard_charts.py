"""The curves of a long run: every point counted, a bounded number drawn, and
what a user looks for (a spike, a dip, the last value, when it was logged)
still in what the chart is drawn from."""

from __future__ import annotations

import json
import math

from primeruns.local.dashboard.charts import MAX_DRAWN, curves, decimate


def test_a_long_curve_is_drawn_from_a_bounded_number_of_points_keeping_its_extremes() -> None:
    n = 10_000
    rows = [{"step": i, "loss": math.sin(i / 50), "_timestamp": 1e9 + i} for i in range(n)]
    rows[7_777]["loss"] = 9.0  # one spike
    rows[1_234]["loss"] = -9.0  # one dip
    drawn = decimate([(r["step"], r["loss"]) for r in rows])
    assert len(drawn) <= MAX_DRAWN + 1
    assert (7_777, 9.0) in drawn and (1_234, -9.0) in drawn
    assert drawn[-1] == (n - 1, rows[-1]["loss"])
    assert [s for s, _ in drawn] == sorted(s for s, _ in drawn)

    (curve,) = curves(rows)
    assert (curve.points, curve.drawn, curve.last_step) == (n, len(drawn), n - 1)
    (series,) = json.loads(curve.data)["series"]
    assert series["step"] == [s for s, _ in drawn]
    assert 9.0 in series["value"] and -9.0 in series["value"]
    # Each drawn point keeps its wall time (the wall-time and relative-time axes).
    assert series["time"] == [1e9 + s for s in series["step"]]


def test_a_short_curve_is_drawn_whole_and_non_finite_values_are_left_out() -> None:
    rows = [{"step": 0, "loss": 1.0}, {"step": 1, "loss": math.nan}, {"step": 2, "loss": 0.5}]
    (curve,) = curves(rows)
    assert (curve.points, curve.drawn, curve.last_value) == (2, 2, 0.5)
    (series,) = json.loads(curve.data)["series"]
    assert (series["step"], series["value"]) == ([0, 2], [1.0, 0.5])
    assert series["time"] is None  # no wall time logged: that axis is off for it


def test_numbers_past_the_floats_are_left_out_not_a_failed_page() -> None:
    """JSON as Python reads it takes integers of any length and ``Infinity``:
    a journal's row holding one (a value, a step, a wall time) made the
    run's page a 500 (OverflowError). Such a value is left out as an
    infinity is, such a step places its row by position, the rest draw."""
    big = 10**400
    rows = [
        {"step": 0, "loss": 1.5, "_timestamp": big},
        {"step": math.inf, "loss": 1.0},
        {"step": big, "loss": 0.75, "huge": -big},
        {"step": 3, "loss": 0.5},
    ]
    (curve,) = curves(rows)
    (series,) = json.loads(curve.data)["series"]
    assert (series["step"], series["value"]) == ([0, 1, 2, 3], [1.5, 1.0, 0.75, 0.5])
    assert series["time"] is None  # no row has a wall time to draw
