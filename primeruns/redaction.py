"""Keep credentials out of what the SDK logs, raises, journals and shows.

A server's text is not ours: a proxy's debug page or a chatty error handler
may echo the request's ``Authorization`` header back, and that text would
otherwise travel into warnings, ``run.errors``, the journal (on disk, in
plain text) and ``primeruns show``. It is scrubbed where it enters (the error
mapping, :mod:`primeruns.platform.errors`) and once more where errors are
journaled (:func:`primeruns.ship.ledger.record_error`), which is handed no
settings: so this module remembers every API key this process resolved.

A module of its own, importing nothing of the SDK: the settings (which
register the key), the platform client and the journal's probe all use it
without an import cycle.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping
from urllib.parse import urlsplit, urlunsplit

__all__ = [
    "MASK",
    "remember_secret",
    "scrub",
    "scrub_cut",
    "url_for_display",
    "without_secrets",
]

MASK = "***"

# A shorter "key" is a test placeholder ("k"); scrubbing it would mangle every
# message that happens to hold the letters, and no real key is that short.
_MIN_SECRET = 8

_lock = threading.Lock()
_secrets: set[str] = set()


def _after_fork_in_child() -> None:
    """A fresh lock: a thread of the parent scrubbing a failure at the fork
    (a run's uplink threads) left it held in the child, whose own first
    failure waited on it for ever. The set it guards is whole (its copy is
    one call under the GIL)."""
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)

# A header (or query/JSON field) echoed with its value: the name is kept so
# the message still says what was there, the value is masked.
_ECHO = re.compile(
    r"(?i)\b(proxy-authorization|authorization|x-api-key|api[-_]?key|access[-_]?token)"
    r"(\"?'?\s*[:=]\s*\"?'?)"
    r"((?:bearer|basic|token)\s+)?"
    r"[^\s\"'<>,;&]+"
)
_BEARER = re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]+")

# Environment variables a child that needs no credentials must not inherit.
_SECRET_NAME = re.compile(r"(?i)(API_?KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)")


def remember_secret(value: str | None) -> None:
    """Scrub ``value`` from every text :func:`scrub` sees from now on (this process)."""
    if value and len(value) >= _MIN_SECRET:
        with _lock:
            _secrets.add(value)


def scrub(text: str, *secrets: str | None) -> str:
    """``text`` without ``secrets``, any key this process resolved, and any
    credential header or ``Bearer`` token echoed in it."""
    with _lock:
        known = set(_secrets)
    known.update(s for s in secrets if s and len(s) >= _MIN_SECRET)
    # A key pasted with blanks around it is sent with them (those before it
    # are blanks between words to h11), and read, and echoed, without them.
    known.update(t for t in (s.strip() for s in list(known)) if len(t) >= _MIN_SECRET)
    # Longest first: a key that contains another is masked whole.
    for secret in sorted(known, key=len, reverse=True):
        for form in _shown(secret):
            if form in text:
                text = text.replace(form, MASK)
    text = _ECHO.sub(lambda m: f"{m[1]}{m[2]}{m[3] or ''}{MASK}", text)
    return _BEARER.sub(lambda m: f"{m[1]}{MASK}", text)


def scrub_cut(text: str, *secrets: str | None) -> str:
    """``text``, the start of a longer text cut off there (an error's body
    read up to its bound), scrubbed as by :func:`scrub`, and a tail of it
    that begins a secret masked too: a key echoed across the cut is no
    longer there whole to be masked, and its first characters would be
    shown."""
    text = scrub(text, *secrets)
    with _lock:
        known = set(_secrets)
    known.update(s for s in secrets if s and len(s) >= _MIN_SECRET)
    longest = 0  # the longest tail of the text that begins a secret
    for secret in known:
        for form in _shown(secret.strip()) + _shown(secret):
            for size in range(min(len(form) - 1, len(text)), longest, -1):
                if text.endswith(form[:size]):
                    longest = size
                    break
    return text[: len(text) - longest] + MASK if longest else text


def _shown(secret: str) -> tuple[str, ...]:
    """``secret`` as a message may hold it: as it is, and as a ``repr`` of
    its text or bytes shows it (h11 refuses a header naming
    ``b'Bearer pk-...\\x0b...'``, which holds the key escaped, not as it is):
    a character that is not printable, a backslash, or a quote where both
    kinds are is escaped there, printable or not."""
    forms = [secret]
    for shown in (repr(secret)[1:-1], repr(secret.encode("utf-8"))[2:-1]):
        # A repr quotes with ' unless the text holds ' and no ": the key
        # within a longer text (its quotes beside it) may be shown either way.
        forms += [shown, shown.replace("'", "\\'"), shown.replace("\\'", "'")]
    return tuple(sorted(set(forms), key=len, reverse=True))  # (longest first, as above)


def url_for_display(url: str) -> str:
    """``url`` without ``user:password@``, query or fragment (a token may hide
    in either), for a message."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return MASK
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def without_secrets(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the variables that look like credentials
    (``PRIME_API_KEY``, any ``*_API_KEY``, ``*TOKEN*``, ``*SECRET*``...): for
    a child process that has no use for them."""
    return {k: v for k, v in environ.items() if not _SECRET_NAME.search(k)}
