"""Which lines of an upload Prime Traces refused for a repeated id to set apart.

The service refuses an upload whose lines repeat a trace id or an episode id
(400 ``duplicate_trace_id``/``duplicate_episode_id``; the local platform
scopes that to one request) and names the id, not its line. Cutting the
batch before a named line does not apply, and halving it until the records
sharing the id went apart took about log2(N) + 1 requests per repeat: a
batch of 300 episodes holding five shipped 15 of its uploads in 57 requests.

The batch's own lines say which records repeat an id, all of them at once:
every line after the first that carries an id, and a line that repeats an
id within itself (two member traces sharing one), which any upload would
refuse. The first line carrying an id goes with the rest of the batch: set
apart too, the id would be on the platform nowhere. Only when the batch
repeats nothing does an id the answer names count, on the one line that
holds it: the service already holds that id (a wider scope than one
request), so that line is refused wherever it goes. One such line a
refusal, the first: the service names the first fault it met, and an
answer naming every id of the batch sets apart one record, not all.

The answer is untrusted input: only ids found in the batch count, read from
a bounded part of the message, so an answer naming ids the batch does not
hold, thousands of them, or garbage sets apart nothing the batch's own
lines do not; the shipper then halves as before (``Shipper._rejected``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from types import MappingProxyType

import orjson

__all__ = ["DUPLICATE_CODES", "lines_to_set_apart", "named_ids"]

#: The service's codes for an upload that repeats an id, and the role of the
#: id each names.
DUPLICATE_CODES: Mapping[str, str] = MappingProxyType(
    {"duplicate_trace_id": "trace", "duplicate_episode_id": "episode"}
)

# What of an answer's message is read, and how many quoted names of it count:
# an id the service names comes first, and a message past these is no answer
# about one id (the client reads at most 64 KiB of an error body anyway).
_MESSAGE_CHARS = 64 * 1024
_NAMED_MAX = 256
# A quoted name, as Python's repr or JSON writes a plain id (an id holding a
# quote or a backslash is not matched: its repeats are still found by line).
_QUOTED = re.compile(r"'([^'\\\n]{1,512})'|\"([^\"\\\n]{1,512})\"")

# An id of the batch: (what it names, the id), so an episode id that equals a
# trace id is not taken for a repeat of it.
_Key = tuple[str, str]


def named_ids(message: str) -> set[str]:
    """The quoted names in the first part of a refusal's message (at most
    ``_NAMED_MAX``), whatever they are: matched against the batch's ids."""
    found: set[str] = set()
    for match in _QUOTED.finditer(message, 0, _MESSAGE_CHARS):
        found.add(match.group(1) or match.group(2))
        if len(found) >= _NAMED_MAX:
            break
    return found


def lines_to_set_apart(
    jsonl: bytes, *, episode: bool, named: Iterable[str] = (), role: str | None = None
) -> list[int]:
    """The 1-based lines of ``jsonl`` (an upload's lines, each ending in LF;
    ``episode``: episode envelopes, else bare traces) to set apart, in order:
    see the module's docstring. ``role``: what the ``named`` ids are
    (``"trace"``, ``"episode"``; None: either). Empty when nothing of the
    batch explains a refusal for a repeated id."""
    keys = [_keys(line, episode=episode) for line in jsonl.split(b"\n")[:-1]]
    apart: list[int] = []
    seen: set[_Key] = set()
    for number, line_keys in enumerate(keys, 1):
        unique = set(line_keys)
        if len(unique) < len(line_keys) or not unique.isdisjoint(seen):
            apart.append(number)
        else:
            seen |= unique
    if apart:
        return apart
    wanted = set(named)
    if not wanted:
        return []
    # Nothing repeats within the batch (each id is on one line): the service
    # holds a named id already.
    for number, line_keys in enumerate(keys, 1):
        if any(k[1] in wanted and role in (None, k[0]) for k in line_keys):
            return [number]
    return []


def _keys(line: bytes, *, episode: bool) -> list[_Key]:
    """The ids one line carries (a line this SDK did not write, or that is
    no JSON object, carries none: it is never set apart for an id)."""
    try:
        doc = orjson.loads(line)
    except orjson.JSONDecodeError:
        return []
    if not isinstance(doc, dict):
        return []
    if not episode:
        return [("trace", doc["id"])] if isinstance(doc.get("id"), str) else []
    keys: list[_Key] = []
    if isinstance(doc.get("id"), str):
        keys.append(("episode", doc["id"]))
    members = doc.get("traces")
    for member in members if isinstance(members, list) else ():
        if isinstance(member, dict) and isinstance(member.get("id"), str):
            keys.append(("trace", member["id"]))
    return keys
