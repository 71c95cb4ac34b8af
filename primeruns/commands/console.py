"""The commands' terminal: rich consoles, the colours a state gets, sizes and ages.

rich renders the tables and progress bars, fits them to the terminal's width
and honours ``NO_COLOR``. On a pipe or a file there is no colour and no width
limit, so a line is never cut short for ``grep``. Every value a user or a
journal supplied goes in as ``Text``, never as markup, so a run named
``[red]x`` shows as written, and through :func:`inert`, so a name holding
terminal escapes cannot set the title or clear the screen. rich is imported
by the CLI only, and only where it draws (a ``--json`` command never loads
it: ~30 ms of ``ls --json``'s start-up): ``import primeruns`` never loads it.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from typing import TYPE_CHECKING, Any, TextIO

import orjson
from rich.filesize import decimal  # (rich's package and this module alone: ~1 ms)

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

__all__ = [
    "emit_json",
    "human_age",
    "human_bytes",
    "inert",
    "inert_text",
    "make_console",
    "outcome_style",
    "outcome_text",
    "shipping_style",
    "shipping_text",
]

# Wide enough that no table or line is ever folded when nobody is watching.
_UNBOUNDED = 10_000

_OUTCOME_STYLES = {
    "completed": "green",
    "failed": "red",
    "crashed": "red",
    "damaged": "red",
    "running": "cyan",
}


# C0 controls (tab and newline included), DEL and C1 controls: what a terminal
# may act on rather than show.
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def inert(text: object) -> str:
    """``text`` safe to print on a terminal: each control character (C0, DEL,
    C1) shown as a visible escape such as ``\\x1b``, everything else as it is.

    For the names, paths and messages a journal or a server supplied, in
    human output only: ``--json`` has the JSON encoder's own escaping.
    """
    shown = str(text)
    if shown.isprintable():  # no control character in it (nearly every cell of a listing)
        return shown
    return _CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", shown)


def inert_text(text: object, style: str = "") -> Text:
    """``Text`` of :func:`inert` ``text``: shown as written, never as markup."""
    from rich.text import Text

    return Text(inert(text), style=style)


@functools.cache
def _console_class() -> type[Console]:
    """rich's Console, made on first use (``import rich.console`` is the cost)."""
    from rich.console import Console

    class _Console(Console):
        """rich's Console, but a closed pipe is left to ``cli.main``: rich would
        exit 1 itself, where the CLI promises 141 (``primeruns ls | head``)."""

        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError

    return _Console


def make_console(stream: TextIO | None = None) -> Console:
    """A console on ``stream`` (stdout by default): the terminal's width and
    colour when it is one, else plain text of any length."""
    file = stream if stream is not None else sys.stdout
    isatty = getattr(file, "isatty", None)
    tty = bool(isatty and isatty())
    return _console_class()(
        file=file,
        width=None if tty else _UNBOUNDED,
        highlight=False,
        emoji=False,
        soft_wrap=not tty,
    )


def fits_a_terminal(console: Console) -> bool:
    """Whether ``console`` lays lines out to a terminal's width (``make_console``):
    off one, a table's cells are never cut nor folded."""
    return console.width < _UNBOUNDED


def outcome_style(outcome: str) -> str:
    return _OUTCOME_STYLES.get(outcome, "")


def outcome_text(outcome: str) -> Text:
    from rich.text import Text

    return Text(outcome, style=outcome_style(outcome))


def shipping_style(shipping: str) -> str:
    """Green once nothing is left to do, red for damage, yellow while work waits."""
    if shipping == "shipped":
        return "green"
    if shipping == "damaged":
        return "red"
    return "cyan" if shipping == "live" else "yellow"


def shipping_text(shipping: str) -> Text:
    from rich.text import Text

    return Text(shipping, style=shipping_style(shipping))


def human_bytes(n: int) -> str:
    return decimal(n)


def human_age(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


# What orjson leaves to ``default`` so it comes out as the standard
# library's ``default=str`` writes it: a dataclass, a date or a time as its
# ``str``, not as an object or an ISO text.
_AS_STR = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME


def emit_json(document: Any) -> None:
    """The one JSON document a ``--json`` command prints on stdout.

    orjson writes it: the standard library's encoder runs in Python once it
    indents, a second of ``ls --json``'s 1.5 with 3,000 journals. Where the
    two would differ the standard library writes it, as it always did: a
    character past ASCII, which it escapes, so a run name's bidirectional
    controls or look-alike letters reach a terminal as escapes; and what
    orjson refuses (an integer past 64 bits, a key that is not text). A float
    that is not a number is written ``null``, where the standard library
    wrote ``NaN``, which no JSON reader takes.
    """
    try:
        text = orjson.dumps(document, default=str, option=orjson.OPT_INDENT_2 | _AS_STR)
    except (TypeError, orjson.JSONEncodeError):
        text = b""
    if text and text.isascii():
        sys.stdout.write(text.decode("ascii"))
    else:
        json.dump(document, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")
