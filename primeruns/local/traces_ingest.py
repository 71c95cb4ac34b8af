"""Turn one Prime Traces upload request into rows, or reject it whole.

Validation is deterministic and all-or-nothing: a request either yields every
row it holds, or a :class:`~.errors.TracesError` with the service's 400 error
code, and then nothing is stored. Limits the service's clients do not give,
decided here:

=============================  ===========================================
metadata part                  at most 64 KiB, ``schema_version`` 1 only
trace ids                      1-512 characters (``invalid_trace`` above)
episode ids / ``env.id``       at most 256 characters
traces per episode             at most 4,096
``timing.start`` window        10 years back, 1 day ahead of the server clock
=============================  ===========================================

``duplicate_trace_id``/``duplicate_episode_id`` are scoped to one request. A
later upload may carry an existing id again: it is stored as a new row (a
re-upload) and reads show the newest copy; ``unknown_episode_reference`` never
fires, as traces name no episode of their own. A member trace's raw document is
its compact JSON re-encoding (the exact bytes exist only for bare traces).
"""

from __future__ import annotations

import hashlib
import re
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from . import jsonlimits, storable
from .errors import TracesError, rejected
from .multipart import MultipartError, Part, boundary_of, parse_parts
from .traces_extract import first_error, has_error, trace_columns
from .traces_extract import number as as_number

MIB = 1024 * 1024
MAX_UPLOAD_BYTES = 256 * MIB
MAX_LINE_BYTES = 64 * MIB
MAX_STAGED_ROWS = 1_000_000
MAX_TRACES_PER_EPISODE = 4096
MAX_TRACE_ID = 512
MAX_EPISODE_ID = 256
MAX_ENV_ID = 256
MAX_METADATA_BYTES = 64 * 1024
LOOKBACK_SECONDS = 10 * 365 * 86400
LOOKAHEAD_SECONDS = 86400
#: Raw request cap: the uncompressed cap plus room for multipart framing.
MAX_REQUEST_BYTES = MAX_UPLOAD_BYTES + MIB

KEY_RE = re.compile(r"^sha256:([0-9a-f]{64})$")


@dataclass
class Upload:
    """A validated upload: its identity and the rows to commit."""

    upload_id: str
    line_format: str
    schema_version: int
    context: dict[str, str]
    episodes: list[dict[str, Any]] = field(default_factory=list)
    traces: list[dict[str, Any]] = field(default_factory=list)
    lines: int = 0
    #: The verified uncompressed JSONL bytes, until :func:`stage_rows` consumes them.
    data: bytes | bytearray = b""


def parse_key(value: str | None) -> str:
    match = KEY_RE.match(value or "")
    if match is None:
        raise rejected(
            "invalid_idempotency_key", "Idempotency-Key must be 'sha256:' and 64 lowercase hex"
        )
    return match.group(1)


def parse_line_format(value: str | None) -> str:
    if value is None or value == "trace":
        return "trace"
    if value == "episode":
        return "episode"
    raise rejected("line_format_mismatch", f"unknown X-Prime-Line-Format {value!r}")


def _single(parts: list[Part], name: str, code: str) -> Part:
    found = [p for p in parts if p.name == name]
    if len(found) != 1:
        raise rejected(code, f"expected exactly one {name!r} part, got {len(found)}")
    return found[0]


def _metadata(part: Part) -> tuple[int, dict[str, str]]:
    if len(part.data) > MAX_METADATA_BYTES:
        raise rejected("invalid_metadata", f"metadata part is over {MAX_METADATA_BYTES} bytes")
    try:
        meta, by_orjson = jsonlimits.parse(bytes(part.data))
        storable.check(meta, by_orjson=by_orjson)  # its context is stored
    except (ValueError, UnicodeDecodeError):
        raise rejected("invalid_metadata", "metadata part is not JSON") from None
    if not isinstance(meta, dict):
        raise rejected("invalid_metadata", "metadata must be a JSON object")
    version = meta.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise rejected("invalid_metadata", "metadata.schema_version must be an integer")
    if version != 1:
        raise rejected("unsupported_schema_version", f"schema_version {version} is not supported")
    context = meta.get("context", {})
    if context is None:
        context = {}
    if not isinstance(context, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in context.items()
    ):
        raise rejected("invalid_metadata", "metadata.context must map strings to strings")
    return version, context


def _payload(part: Part) -> bytes | bytearray:
    encoding = part.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        data: bytes | bytearray = bytes(part.data)
    elif encoding == "gzip":
        data = _gunzip(bytes(part.data))
    else:
        raise rejected("malformed_encoding", f"unsupported part Content-Encoding {encoding!r}")
    if len(data) > MAX_UPLOAD_BYTES:
        raise rejected("upload_too_large", f"upload is over {MAX_UPLOAD_BYTES} uncompressed bytes")
    return data


def _inflate_module() -> ModuleType:
    """ISA-L's zlib where isal has a wheel (the dependency's platform marker),
    else zlib. ISA-L inflates a traces upload in less than half zlib's CPU
    (5.4 ms against 13 ms for 500 gsm8k episodes, 4.4 MiB); both are used
    alike, and each raises its own ``error`` (isal's ``IsalError`` is not a
    ``zlib.error``)."""
    try:
        from isal import isal_zlib
    except ImportError:
        return zlib
    return isal_zlib


_INFLATE = _inflate_module()

#: Output per decompression step: the body grows by this much at a time.
#: 1 MiB, not 4: each step's output is a new object, and one of 4 MiB was
#: fresh memory from the kernel every time (a fifth more CPU to inflate a
#: 5 MB upload; page faults cost much on the machines the benchmarks run on).
_INFLATE_STEP = 1 * MIB


def _gunzip(compressed: bytes) -> bytearray:
    """The gzip stream decompressed, refused once it passes MAX_UPLOAD_BYTES.

    Streamed in steps into one growing buffer, so a bomb costs at most the cap
    (one ``decompress`` call with ``max_length`` builds its output in a buffer
    that it then copies: twice the cap at the peak).
    """
    inflater = _INFLATE.decompressobj(wbits=31)
    out = bytearray()
    pending = compressed
    try:
        while pending and not inflater.eof:
            out += inflater.decompress(pending, _INFLATE_STEP)
            pending = inflater.unconsumed_tail
            if len(out) > MAX_UPLOAD_BYTES:
                raise rejected(
                    "upload_too_large", f"upload is over {MAX_UPLOAD_BYTES} uncompressed bytes"
                )
        out += inflater.flush()
    except _INFLATE.error as exc:
        raise rejected("malformed_encoding", f"traces part is not valid gzip: {exc}") from None
    if not inflater.eof:
        raise rejected("malformed_encoding", "traces part is a truncated gzip stream")
    return out  # not bytes(out): that copy would double the peak again


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _decode_line(line: bytes, number: int, *, as_written: bool) -> tuple[dict[str, Any], bool]:
    """The line's object, and whether orjson parsed it (``jsonlimits.parse``);
    ``as_written``: the line is stored as sent (a bare trace)."""
    try:
        doc, by_orjson = jsonlimits.parse(
            line, parse_constant=_reject_constant, utf8=True, as_written=as_written
        )
        # A lone surrogate (its id, a column, cannot be stored: a 500) or a
        # number past a double (1e400) is refused as NaN is.
        storable.check(doc, by_orjson=by_orjson)
    except UnicodeDecodeError:
        raise rejected("malformed_encoding", f"line {number} is not UTF-8") from None
    except ValueError as exc:
        raise rejected("invalid_trace", f"line {number} is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise rejected("invalid_trace", f"line {number} is not a JSON object")
    return doc, by_orjson


def _check_trace(doc: Any, where: str, now: float) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise rejected("invalid_trace", f"{where}: a trace must be a JSON object")
    trace_id = doc.get("id")
    if not isinstance(trace_id, str) or not trace_id or len(trace_id) > MAX_TRACE_ID:
        raise rejected("invalid_trace", f"{where}: trace id must be a string of 1-{MAX_TRACE_ID}")
    version = doc.get("version")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
        raise rejected("invalid_trace", f"{where}: trace version must be an integer")
    timing = doc.get("timing")
    start = as_number(timing.get("start")) if isinstance(timing, dict) else None
    if start is None:
        raise rejected("invalid_trace", f"{where}: trace {trace_id!r} has no numeric timing.start")
    if not now - LOOKBACK_SECONDS <= start <= now + LOOKAHEAD_SECONDS:
        raise rejected(
            "created_at_out_of_window", f"{where}: trace {trace_id!r} timing.start is out of window"
        )
    return doc


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


#: A line holding something besides whitespace, matched from its start (the
#: anchor makes every other position fail at once, so a scan is linear).
_LINE = re.compile(rb"^[ \t\r\x0b\x0c]*+[^\s][^\n]*", re.MULTILINE)


def _lines(data: bytes | bytearray) -> Iterator[tuple[int, bytes]]:
    """(number, line) of each non-blank line, found as the caller consumes them.

    Never ``data.split``: 256 MiB of newlines is 256 Mi empty slices, 2 GiB of
    list on top of the body (the security review's gzip bomb). Blank lines are
    skipped by the regex engine and counted, not materialized.
    """
    number, position = 1, 0
    for match in _LINE.finditer(data):
        start, end = match.span()
        number += data.count(b"\n", position, start)
        position = start
        if end - start > MAX_LINE_BYTES:
            raise rejected("trace_too_large", f"line {number} is over {MAX_LINE_BYTES} bytes")
        yield number, match.group()


def verify_request(
    *, content_type: str, body: bytes, key_header: str | None, format_header: str | None
) -> Upload:
    """Check the request's framing and digest; rows are staged later by :func:`stage_rows`.

    Split in two so that a replay (or a 409 for another line format) is answered
    from the key alone, before the lines are judged against the declared format.
    """
    upload_id = parse_key(key_header)
    line_format = parse_line_format(format_header)
    boundary = boundary_of(content_type)
    if boundary is None:
        raise TracesError(415, "invalid_metadata", "upload must be multipart/form-data")
    try:
        parts = parse_parts(boundary, body)
    except MultipartError as exc:
        raise rejected("malformed_encoding", str(exc)) from None
    version, context = _metadata(_single(parts, "metadata", "invalid_metadata"))
    data = _payload(_single(parts, "traces", "invalid_metadata"))
    if hashlib.sha256(data).hexdigest() != upload_id:
        raise rejected("digest_mismatch", "Idempotency-Key does not match the uncompressed bytes")
    return Upload(upload_id, line_format, version, context, data=data)


def stage_rows(upload: Upload, ingested_at: float) -> Upload:
    """Validate every line and build the rows; raises TracesError (400) on the first fault."""
    now = time.time()
    stamp = ingested_at
    line_format = upload.line_format
    data, upload.data = upload.data, b""
    staged = 0
    seen_traces: set[str] = set()
    seen_episodes: set[str] = set()

    def add_trace(doc: dict[str, Any], raw: bytes, episode_id: str | None, env: str | None) -> None:
        if doc["id"] in seen_traces:
            raise rejected("duplicate_trace_id", f"trace id {doc['id']!r} repeats in this upload")
        seen_traces.add(doc["id"])
        row = trace_columns(doc, env)
        row.update(episode_id=episode_id, size_bytes=len(raw), raw=raw, ingested_at=stamp)
        upload.traces.append(row)

    for number, line in _lines(data):
        upload.lines += 1
        doc, by_orjson = _decode_line(line, number, as_written=line_format == "trace")
        is_episode_line = isinstance(doc.get("traces"), list)
        if is_episode_line != (line_format == "episode"):
            raise rejected(
                "line_format_mismatch", f"line {number} does not match line format {line_format!r}"
            )
        if line_format == "trace":
            staged += 1
            add_trace(_check_trace(doc, f"line {number}", now), line, None, None)
        else:
            staged += 1 + len(doc["traces"])
            _add_episode(upload, doc, by_orjson, number, now, stamp, seen_episodes, add_trace)
        if staged > MAX_STAGED_ROWS:
            raise rejected("too_many_traces_in_upload", f"over {MAX_STAGED_ROWS} staged rows")
    return upload


def _add_episode(
    upload: Upload,
    doc: dict[str, Any],
    by_orjson: bool,
    number: int,
    now: float,
    stamp: float,
    seen: set[str],
    add_trace: Any,
) -> None:
    episode_id = doc.get("id")
    if not isinstance(episode_id, str) or not episode_id:
        raise rejected("invalid_trace", f"line {number}: episode id must be a non-empty string")
    if len(episode_id) > MAX_EPISODE_ID:
        raise rejected("episode_id_too_long", f"line {number}: episode id over {MAX_EPISODE_ID}")
    if episode_id in seen:
        raise rejected("duplicate_episode_id", f"episode id {episode_id!r} repeats in this upload")
    seen.add(episode_id)
    env = _mapping(doc.get("env"))
    env_id = env.get("id")
    if env_id is not None and not isinstance(env_id, str):
        raise rejected("invalid_trace", f"line {number}: env.id must be a string")
    if env_id is not None and len(env_id) > MAX_ENV_ID:
        raise rejected("environment_id_too_long", f"line {number}: env.id over {MAX_ENV_ID}")
    members = doc["traces"]
    if len(members) > MAX_TRACES_PER_EPISODE:
        raise rejected(
            "too_many_traces_in_episode", f"line {number}: over {MAX_TRACES_PER_EPISODE} traces"
        )
    starts: list[float] = []
    for index, member in enumerate(members):
        trace = _check_trace(member, f"line {number} trace {index}", now)
        starts.append(float(trace["timing"]["start"]))
        add_trace(trace, jsonlimits.compact(trace, by_orjson=by_orjson), episode_id, env_id)
    run = _mapping(doc.get("run"))
    error_type, error_message = first_error(doc)
    outcome = doc.get("stop_condition")
    if outcome is None and members:
        outcome = members[0].get("stop_condition")
    envelope = {**doc, "traces": [m["id"] for m in members]}
    upload.episodes.append(
        {
            "episode_id": episode_id,
            "run_id": run.get("id") if isinstance(run.get("id"), str) else None,
            "run_type": run.get("type") if isinstance(run.get("type"), str) else None,
            "run_name": run.get("name") if isinstance(run.get("name"), str) else None,
            "environment_id": env_id,
            "outcome": outcome if isinstance(outcome, str) else None,
            "has_error": has_error(doc),
            "error_type": error_type,
            "error_message": error_message,
            "schema_version": upload.schema_version,
            "created_at": min(starts) if starts else stamp,
            "ingested_at": stamp,
            "raw": jsonlimits.compact(envelope, by_orjson=by_orjson),
        }
    )
