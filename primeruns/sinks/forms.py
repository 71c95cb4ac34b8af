"""What an episode is sent as: its Prime Traces line and its sample rows.

Both are made from the record stamped with the platform run
(``records.stamp_run``), each by the sink that sends it, or both at once by
whichever of an evaluation's two sinks parses the entry first
(``ship.parsed``), for the other to take as bytes: parsing the record is
the largest cost of shipping an episode, and the record itself, hundreds of
Python containers, is not kept for the other sink (the garbage collector
walked what was kept again and again).

What went wrong making one of them (a record the service cannot take, a
projection that fails) is kept in its place and raised by the sink that
sends it, at the entry where it would have raised making it itself.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import orjson

from ..platform.binding import Binding
from ..projection import SampleRows, numbered_rows, sample_rows
from ..records import is_episode, stamp_run

__all__ = [
    "Forms",
    "Line",
    "line_of",
    "made",
    "make_forms",
    "numbered_rows_of",
    "rows_of",
    "size",
]


class Line(NamedTuple):
    """Prime Traces' JSONL line of a record (no LF), and whether the record
    has traces (for the ``episodes_written`` counter; None: not an object)."""

    line: bytes
    with_traces: bool | None


class Forms(NamedTuple):
    """An entry's forms: each what ``made`` returns, or the error making it
    raised (None where it was not asked for)."""

    line: Line | BaseException | None
    rows: SampleRows | BaseException | None


def make_forms(record: Any, binding: Binding, *, line: bool, rows: bool) -> Forms:
    """The forms of ``record`` asked for, the record stamped once for both."""
    stamped: Any = None
    stamp_error: BaseException | None = None
    try:
        stamped = stamp_run(record, binding.run_id, binding.kind)
    except Exception as exc:  # raised by the sink it concerns, when it sends
        stamp_error = exc
    made_line: Line | BaseException | None = None
    if line:
        try:
            if stamp_error is not None:
                raise stamp_error
            with_traces = bool(record.get("traces")) if isinstance(record, dict) else None
            made_line = Line(orjson.dumps(stamped), with_traces)
        except Exception as exc:
            made_line = exc
    made_rows: SampleRows | BaseException | None = None
    if rows:
        try:
            subject = _for_rows(record, stamped, stamp_error)
            # The stamped episode's JSON, made for its line, is the row's
            # copy of the record as it is: not encoded again.
            encoded = made_line.line if isinstance(made_line, Line) and subject is stamped else None
            # Parsed from JSON, so every number is finite: no null-ing copy.
            made_rows = sample_rows(subject, finite=True, encoded=encoded)
        except Exception as exc:
            made_rows = exc
    return Forms(made_line, made_rows)


def _for_rows(record: Any, stamped: Any, stamp_error: BaseException | None) -> Any:
    """What the sample rows are made of: an episode stamped (its
    ``native_wrapper`` names the platform's run, as the traces service's copy
    does: a run logged offline, then replayed, journaled its local id, which
    the platform never knew), anything else as it is."""
    if isinstance(record, dict) and is_episode(record):
        if stamp_error is not None:
            raise stamp_error
        return stamped
    return record


def numbered_rows_of(
    record: Any, binding: Binding, number: int
) -> tuple[tuple[str, ...], list[bytes]]:
    """The sample rows of ``record`` numbered ``number``, encoded, and their
    ids: where its ``SampleRows`` do not fit the number (``SampleRows.fits``)."""
    stamped = stamp_run(record, binding.run_id, binding.kind) if isinstance(record, dict) else None
    return numbered_rows(_for_rows(record, stamped, None), number, finite=True)


def made(form: Any) -> Any:
    """A form as made: raises the error making it raised."""
    if isinstance(form, BaseException):
        raise form
    return form


def line_of(record: Any, binding: Binding) -> Line:
    """The Prime Traces line of ``record`` (raises what making it raised)."""
    form: Line = made(make_forms(record, binding, line=True, rows=False).line)
    return form


def rows_of(record: Any, binding: Binding) -> SampleRows | None:
    """The sample rows of ``record`` (raises what making them raised)."""
    form: SampleRows | None = made(make_forms(record, binding, line=False, rows=True).rows)
    return form


def size(forms: Forms) -> int:
    """The bytes ``forms`` hold."""
    total = len(forms.line.line) if isinstance(forms.line, Line) else 0
    if isinstance(forms.rows, SampleRows):
        total += sum(map(len, forms.rows.rows))
    return total
