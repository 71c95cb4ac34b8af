"""A Parquet export converts its metric rows a batch at a time: whatever the
batches, it writes what one conversion of every row at once would (the same
columns, types and values, every row), or refuses the rows just as that
would. Checked against that conversion on generated rows."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from primeruns.commands import export
from primeruns.commands.common import CommandError

pq = pytest.importorskip("pyarrow.parquet")

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.sampled_from([0.5, 2.0]),
    st.sampled_from(["s", ""]),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=2), st.dictionaries(st.sampled_from(["x", "y"]), inner, max_size=2)
    ),
    max_leaves=4,
)
_rows = st.lists(
    st.dictionaries(st.sampled_from(["a", "b", "c"]), _values, max_size=3), min_size=1, max_size=6
)


def _export(rows: list[dict[str, Any]], batch: int, target: Path) -> object:
    def batches(journal: object, damage: object) -> Iterator[list[dict[str, Any]]]:
        return (rows[i : i + batch] for i in range(0, len(rows), batch))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(export, "_row_batches", batches)
        target.unlink(missing_ok=True)
        try:
            written = export._write_parquet(None, str(target), [])  # type: ignore[arg-type]
        except CommandError:
            assert not target.exists()
            return "refused"
    table = pq.read_table(target)
    assert written == table.num_rows == len(rows)
    return table.schema, table.to_pylist()


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(rows=_rows)
def test_rows_converted_a_batch_at_a_time_are_written_as_all_at_once(
    rows: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    target = tmp_path_factory.mktemp("parquet") / "rows.parquet"
    assert _export(rows, 1, target) == _export(rows, 2, target) == _export(rows, 10_000, target)
