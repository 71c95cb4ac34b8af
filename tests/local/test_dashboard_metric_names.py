"""Metric names as the charts keep them: a name holding a lone surrogate is
charted repaired (U+FFFD), and what is remembered of such names is bounded
as the names are (a body is the platform's untrusted input)."""

from __future__ import annotations

from primeruns.local.dashboard.metric_rows import MAX_METRIC_NAMES, MetricRows


def test_names_that_repair_to_one_are_not_remembered_past_the_bound() -> None:
    """Thousands of distinct names repairing to one (``"x\\ud800"``,
    ``"x\\ud801"``, ...) count as one name and one value a row: the bound
    on values let every one of them be remembered, so a run of such rows
    held memory in proportion to its bodies, not to what is charted."""
    rows = MetricRows()
    for n in range(200):
        # Two high surrogates never pair: each name is "x\ufffd\ufffd" charted.
        names = (f"x{chr(0xD800 + n)}{chr(0xD800 + k)}" for k in range(10))
        rows.add({"step": n, **dict.fromkeys(names, 1.0)})
    assert rows.names == {"x\ufffd\ufffd"}
    assert rows.values == 400  # a step and one value a row
    assert len(rows.repaired) <= MAX_METRIC_NAMES, len(rows.repaired)


def test_a_repaired_name_is_charted_as_the_one_it_repairs_to() -> None:
    rows = MetricRows()
    rows.add({"step": 0, "x\ud800": 1.0})
    rows.add({"step": 1, "x\udc00": 2.0})
    rows.add({"step": 2, "x\ufffd": 3.0})
    assert rows.names == {"x\ufffd"}
    assert [r["x\ufffd"] for r in rows.rows] == [1.0, 2.0, 3.0]
