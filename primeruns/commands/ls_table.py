"""``primeruns ls``'s table: a journal a line, laid out for a terminal or a pipe.

Apart from the command (``ls``) so that ``ls --json`` never loads rich (its
console and text are ~30 ms of a listing's start-up): only a listing drawn
as a table imports this module. The lines are laid out here
(``_fast_table``): rich measures and renders every cell of a ``Table``
several times, ~1 ms a run; its ``Table`` is used only where even three
columns do not fit the terminal (``_fitting_table``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.cells import cell_len
from rich.console import Console
from rich.control import strip_control_codes
from rich.segment import Segment, Segments
from rich.style import Style
from rich.text import Text

from ..reports import RECORD_KINDS, UNIT_LABELS, RunStatus
from .console import (
    fits_a_terminal,
    human_age,
    human_bytes,
    inert,
    outcome_style,
    shipping_style,
)

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["draw"]


def _logged(status: RunStatus) -> str:
    counts = status.counts
    parts = [
        f"{counts[name]} {UNIT_LABELS[kind]}" for name, kind in RECORD_KINDS.items() if counts[name]
    ]
    return ", ".join(parts) if parts else "-"


# A cell as printed: its text (shown as written: ``console.inert`` or rich's
# own stripping, as ``Text`` would) and its style. Plain pairs, not ``Text``:
# a listing of thousands of runs made ten ``Text`` a run only to read them back.
_Cell = tuple[str, str]


def _stripped(text: str) -> str:
    """``text`` as ``Text`` keeps it (rich's ``strip_control_codes``): as it
    is where it holds no control character at all, nearly every cell, which
    is told without a translation table a cell."""
    return text if text.isprintable() else strip_control_codes(text)


def _plain(text: str, style: str = "") -> _Cell:
    """A cell of text this command made (numbers, sizes, states), as ``Text`` keeps it."""
    return _stripped(text), style


def _inert(value: object, style: str = "") -> _Cell:
    """A cell of text a journal supplied: ``inert_text``'s."""
    return inert(value), style


def _outcome(outcome: str) -> _Cell:
    return _stripped(outcome), outcome_style(outcome)


def _shipping(shipping: str) -> _Cell:
    return _stripped(shipping), shipping_style(shipping)


def _unless_not_opened(status: RunStatus, text: str) -> _Cell:
    return ("-", "") if status.info.not_opened is not None else _plain(text)


# Each column: its header, how to fill a cell, and its options; listed in the
# order they are dropped last to first when the terminal is too narrow.
_Column = tuple[str, Callable[[RunStatus], _Cell], dict[str, Any]]
_COLUMNS: list[_Column] = [
    ("LOCAL ID", lambda s: _inert(s.info.local_id), {"no_wrap": True}),
    ("OUTCOME", lambda s: _outcome(s.outcome), {"no_wrap": True}),
    ("SHIPPING", lambda s: _shipping(s.shipping), {"no_wrap": True}),
    # Cut, not folded, past 32 cells on a terminal: a journal a line (``_fast_table``).
    ("NAME", lambda s: _inert((s.spec.name if s.spec else None) or "-"),
     {"max_width": 32, "no_wrap": True}),
    ("LOGGED", lambda s: _plain(_logged(s)), {}),
    ("LOST", lambda s: _plain(str(s.losses_total), "red") if s.losses_total else ("-", ""),
     {"justify": "right"}),
    ("KIND", lambda s: _inert(s.spec.kind if s.spec else "?"), {}),
    # Unknown for a journal not opened (a link is never followed): "-".
    ("AGE", lambda s: _unless_not_opened(s, human_age(s.age_s)),
     {"justify": "right", "no_wrap": True}),
    ("SIZE", lambda s: _unless_not_opened(s, human_bytes(s.info.size_bytes)),
     {"justify": "right", "no_wrap": True}),
    ("RUN ID", lambda s: _inert(s.platform.get("run_id") or "-"), {"no_wrap": True}),
]  # fmt: skip
_SHOWN_ORDER = ["LOCAL ID", "RUN ID", "KIND", "NAME", "OUTCOME", "SHIPPING", "LOGGED", "LOST"]


# Marks a journal listed under its run's head (run_groups).
_NESTED = "└ "
_NESTED_CELLS = cell_len(_NESTED)


def _cells(
    found: list[RunStatus], cell: Callable[[RunStatus], _Cell], name: str, nested: set[int]
) -> list[_Cell]:
    """One column's cells; the local ids of nested journals marked so."""
    if name != "LOCAL ID" or not nested:
        return [cell(status) for status in found]
    # The mark made part of the id's text: a run of thousands of workers
    # lists as fast as thousands of runs.
    return [
        _inert(_NESTED + status.info.local_id) if i in nested else cell(status)
        for i, status in enumerate(found)
    ]


def _table(found: list[RunStatus], columns: list[_Column], nested: set[int]) -> Table:
    from rich.table import Table  # the fallback's alone (``_fast_table``)

    order = {name: i for i, name in enumerate([*_SHOWN_ORDER, "SIZE", "AGE"])}
    shown = sorted(columns, key=lambda c: order[c[0]])
    table = Table(box=None, pad_edge=False, header_style="bold")
    for header, _, options in shown:
        table.add_column(header, overflow="ellipsis", **options)
    cells = [_cells(found, cell, name, nested) for name, cell, _ in shown]
    for i in range(len(found)):
        table.add_row(*(Text(*column[i]) for column in cells))
    return table


def _cell_len(text: str) -> int:
    """The cells ``text`` takes on a terminal (rich's ``cell_len``): one a
    character for printable ASCII, nearly every cell of a listing, which
    rich's measure took a tenth of drawing thousands of runs to say."""
    if text.isascii() and text.isprintable():
        return len(text)
    rest = text[len(_NESTED) :] if text.startswith(_NESTED) else None
    if rest is not None and rest.isascii() and rest.isprintable():
        # A nested journal's id behind its mark: each id is another string,
        # which rich measures character by character (its cache misses).
        return _NESTED_CELLS + len(rest)
    return cell_len(text)


_GAP = "  "  # between two columns: rich's padding of one on each side, none at the edges


def _fast_table(found: list[RunStatus], console: Console, nested: set[int]) -> Segments | None:
    """The table ``_fitting_table`` makes, as the segments of its lines: rich
    measures and renders every cell of a Table several times, ~1 ms a run,
    and wraps a Text of its lines again when printing it (seconds for a runs
    directory of thousands). None when even the first three columns do not
    fit at their natural width: rich then folds them (``_fitting_table``).
    On a terminal a cell past its column's ``max_width`` is cut with an
    ellipsis, as rich's table cuts it (``no_wrap``): a journal a line."""
    width = console.width
    cells = {name: _cells(found, cell, name, nested) for name, cell, _ in _COLUMNS}
    lengths = {name: [_cell_len(text) for text, _ in texts] for name, texts in cells.items()}
    # A column's cap is for a terminal's width: off one, nothing is cut, so
    # that ``ls | grep`` finds a run by its whole name.
    capped = fits_a_terminal(console)
    widths: dict[str, int] = {}
    for name, _, options in _COLUMNS:
        natural = max([len(name), *lengths[name]])
        widths[name] = min(natural, int(options.get("max_width", natural))) if capped else natural
    columns = list(_COLUMNS)

    def total() -> int:
        return sum(widths[c[0]] for c in columns) + len(_GAP) * (len(columns) - 1)

    while len(columns) > 3 and total() > width:
        columns.pop()
    if total() > width:
        return None
    order = {name: i for i, name in enumerate([*_SHOWN_ORDER, "SIZE", "AGE"])}
    shown = sorted(columns, key=lambda c: order[c[0]])
    laid = [
        _laid_out(name, cells[name], lengths[name], widths[name], options, i == len(shown) - 1)
        for i, (name, _, options) in enumerate(shown)
    ]
    if console.color_system is None:
        # Off a terminal (or without colour) a style renders as nothing
        # (``Style.render``): the lines are the table, in one segment.
        # Segments of a style each, gathered cell by cell, were a sixth of
        # ``ls | ...`` of thousands of runs.
        rows = zip(*([f"{b}{t}{a}" for b, (t, _), a in column] for column in laid), strict=True)
        return Segments([Segment("".join(["".join(row) + "\n" for row in rows]))])
    return _styled(laid, console)


# A laid out cell: what comes before its text (a right-justified column's
# padding), its text and style, and what follows (a left-justified column's
# padding and the gap to the next column).
_LaidCell = tuple[str, _Cell, str]


def _laid_out(
    name: str,
    texts: list[_Cell],
    lengths: list[int],
    room: int,
    options: dict[str, Any],
    last: bool,
) -> list[_LaidCell]:
    """One shown column's header and cells, each cut to ``room`` cells (with an
    ellipsis, as rich cuts it) and padded to it; the ``last`` one unpadded on
    the right and without the gap."""
    right = options.get("justify") == "right"
    out: list[_LaidCell] = []
    for (text, style), length in zip([(name, "bold"), *texts], [len(name), *lengths], strict=True):
        if length > room:
            cut = Text(text)
            cut.truncate(room, overflow="ellipsis")
            text, length = cut.plain, cut.cell_len
        pad = " " * (room - length)
        if right:
            out.append((pad, (text, style), "" if last else _GAP))
        else:
            out.append(("", (text, style), "" if last else pad + _GAP))
    return out


def _styled(laid: list[list[_LaidCell]], console: Console) -> Segments:
    """The lines of ``laid`` columns as segments, each run of neighbours in one
    style as one segment (rich renders each segment it is given in turn, a
    style's codes around each)."""
    styles: dict[str, Style | None] = {"": None}
    out: list[Segment] = []
    texts: list[str] = []
    current: Style | None = None
    for row in zip(*laid, strict=True):
        pieces: list[tuple[str, Style | None]] = []
        for before, (text, name), after in row:
            if name not in styles:
                styles[name] = console.get_style(name)
            pieces += ((before, None), (text, styles[name]), (after, None))
        pieces.append(("\n", None))
        for piece, style in pieces:
            if style is not current:
                if texts:
                    out.append(Segment("".join(texts), current))
                texts, current = [], style
            texts.append(piece)
    if texts:
        out.append(Segment("".join(texts), current))
    return Segments(out)


def _fitting_table(
    found: list[RunStatus], width: int, measure: Callable[[Table], int], nested: set[int]
) -> Table:
    """The table with as many columns as fit ``width`` at their natural width (so
    nothing wraps), the least needed dropped first."""
    columns = list(_COLUMNS)
    table = _table(found, columns, nested)
    while len(columns) > 3 and measure(table) > width:
        columns.pop()
        table = _table(found, columns, nested)
    return table


def draw(found: list[RunStatus], console: Console, nested: set[int]) -> None:
    """Print the table of ``found`` (``nested``: the rows listed under their
    run's head) on ``console``, with as many columns as fit."""
    lines = _fast_table(found, console, nested)
    if lines is not None:
        console.print(lines, crop=False)
        return
    table = _fitting_table(
        found,
        console.width,
        lambda t: console.measure(t, options=console.options.update_width(1 << 16)).maximum,
        nested,
    )
    console.print(table)
