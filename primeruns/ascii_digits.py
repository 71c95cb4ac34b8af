"""A number read from untrusted text: ASCII decimal digits alone, and few.

A journal, an environment variable and a header are untrusted: ``str.isdigit``
passes a superscript two, which ``int`` refuses, and Arabic-Indic digits,
which ``int`` reads as a number nobody wrote; ``int`` refuses thousands of
digits with a ValueError, where one raise could fail every open of a journal
or lose a whole numbering. Every place that reads such a number goes through
:func:`decimal_or_none`, with the most digits the number it reads can have,
so what passes is decided once, and a place cannot forget half of it.
"""

from __future__ import annotations

__all__ = ["decimal_or_none", "declared_over"]

# A Content-Length of more significant digits says more than any limit:
# 10**18 bytes is past what anything here takes.
_LENGTH_DIGITS = 18


def decimal_or_none(text: str, most_digits: int) -> int | None:
    """``text`` as an int when it is ASCII decimal digits alone, at least one
    and at most ``most_digits`` of them (leading zeros counted), else None:
    no sign, space, underscore or other digits, which ``int`` would take."""
    if len(text) > most_digits or not _ascii_digits(text):
        return None
    try:
        return int(text)
    except ValueError:  # past int's limit on digits (PYTHONINTMAXSTRDIGITS)
        return None


def declared_over(declared: str, limit: int) -> bool:
    """Whether a body said (a Content-Length) to be ``declared`` bytes long is
    over ``limit`` bytes. Leading zeros say nothing; past 18 significant
    digits it is over any limit. One that is not ASCII digits says nothing
    (False): such a body is read by its bytes, within the limit."""
    digits = declared.lstrip("0") or "0"
    length = decimal_or_none(digits, _LENGTH_DIGITS)
    if length is None:
        return len(digits) > _LENGTH_DIGITS and _ascii_digits(digits)
    return length > limit


def _ascii_digits(text: str) -> bool:
    # Both: ``isdigit`` alone passes other scripts' digits and superscripts.
    return text.isascii() and text.isdigit()
