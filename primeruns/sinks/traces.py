"""Prime Traces: every episode and bare trace, content addressed.

A batch is JSONL of the records stamped with the platform run (``run.id`` and
``run.type`` on the envelope and on every member trace: the service reads the
run from each trace's own block), uploaded as a multipart form of a
``metadata`` part and a ``traces`` part holding the JSONL gzip-compressed (see
docs/ARCHITECTURE.md, "The wire"). The
``Idempotency-Key`` is the SHA-256 of the uncompressed JSONL, and the whole
request body (boundary included) is derived from those bytes alone, so a
recorded batch resends byte for byte and the service answers a resend with the
receipt it already committed: retries, ambiguous failures and restarts never
store a record twice.

An account the service is not enabled for (403 ``service_not_enabled`` before
this run's first committed receipt) or a run opted out turns the sink off
quietly: the other sinks still carry every episode, so it is not a loss.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

try:
    # ISA-L's deflate: a 4 MiB batch of gsm8k episodes in 5.4 ms of CPU where
    # zlib's level 1 took 22 ms (a fifth of the traces shipper's CPU in a
    # backlog), both with the GIL released (isal's from 1.2, the declared
    # floor); the stream it writes is 2% smaller.
    from isal.isal_zlib import compress as _deflate
except ImportError:  # a platform isal has no wheel for (the dependency's marker)
    from zlib import compress as _deflate

from ..exceptions import ForbiddenError, TraceTooLargeError, ValidationRejectedError
from ..journal import Entry, EntryKind
from ..platform import PlatformClient
from . import receipts, repeated_ids
from .base import Binding, Prepared, SendContext, SinkOff, parse_entry
from .forms import Line, line_of
from .kinds import SINK_KINDS

__all__ = [
    "BACKLOG_BATCH_BYTES",
    "MAX_LINE_BYTES",
    "TARGET_BATCH_BYTES",
    "TracesSink",
    "TracesUpload",
    "multipart_body",
]

#: Batches stay under a 32 MiB request cap in front of the service.
TARGET_BATCH_BYTES = 30 * 1024 * 1024
#: What one batch reads of a backlog (payload bytes; ~450 gsm8k episodes, ~1 MB
#: gzipped), a single entry over it going alone. The next batch is prepared
#: while one is in flight (``ship.early``), so small batches overlap the
#: platform's work with this process's: the first request goes sooner, and no
#: 30 MiB batch is stamped and gzipped (0.5-0.7 s) while the platform waits
#: for it. 5,000 episodes flat out, on a quiet machine: 0.75x the vendor's
#: episodes/s in 30 MiB batches, 0.76-0.90x in 8 MiB ones, 0.93x in 4 MiB ones;
#: 2 MiB ones were slower again (tools/bench/end_to_end.py).
BACKLOG_BATCH_BYTES = 4 * 1024 * 1024
#: The service's per-line limit (content without the LF).
MAX_LINE_BYTES = 64 * 1024 * 1024
_MAX_LINES = 10_000
# Level 1: on a fast link compression is pure CPU; JSON still shrinks ~4x.
_GZIP_LEVEL = 1
# A gzip stream (header, deflate, CRC-32 and size trailer), its mtime 0.
_GZIP_WBITS = 31
# The service's limit on one upload's uncompressed bytes.
_MAX_UPLOAD_BYTES = 256 * 1024 * 1024


# The head of an upload's traces part: written by ``multipart_body``, found
# again by ``_jsonl_of`` (the metadata part before it is JSON, which holds no
# CR or LF, so the first match is this part's).
_TRACES_PART_HEAD = (
    b'Content-Disposition: form-data; name="traces"; filename="traces.jsonl"\r\n'
    b"Content-Type: application/x-ndjson\r\n"
    b"Content-Encoding: gzip\r\n\r\n"
)


def multipart_body(jsonl: bytes, metadata: Mapping[str, Any]) -> tuple[bytes, str, str]:
    """``(body, content_type, idempotency_key)`` for one upload, deterministic
    in its inputs (gzip with mtime 0, boundary derived from the digest)."""
    digest = hashlib.sha256(jsonl).hexdigest()
    gz = _deflate(jsonl, _GZIP_LEVEL, wbits=_GZIP_WBITS)
    boundary = f"primeruns-{digest[:32]}"
    while boundary.encode() in gz:  # vanishingly rare; keep the framing unambiguous
        boundary += "x"
    meta = orjson.dumps(dict(metadata))
    b = boundary.encode()
    body = b"".join(
        [
            b"--" + b + b"\r\n",
            b'Content-Disposition: form-data; name="metadata"\r\n',
            b"Content-Type: application/json\r\n\r\n",
            meta,
            b"\r\n--" + b + b"\r\n",
            _TRACES_PART_HEAD,
            gz,
            b"\r\n--" + b + b"--\r\n",
        ]
    )
    return body, f"multipart/form-data; boundary={boundary}", f"sha256:{digest}"


@dataclass(frozen=True)
class TracesUpload:
    """What a resend needs besides the body (one request: nothing of it moves
    on): the multipart ``content_type``, the Idempotency-Key (``key``), and
    whether the lines are episodes (``episode``) rather than bare traces."""

    content_type: str
    key: str
    episode: bool


class TracesSink:
    """Uploads episodes and bare traces to Prime Traces."""

    name = "traces"
    kinds = SINK_KINDS["traces"]
    max_entries = _MAX_LINES
    max_bytes = BACKLOG_BATCH_BYTES
    # The service validates an upload whole before it commits any of it, and
    # names the first line it refused (or, for a repeated id, the id:
    # ``set_apart`` finds its lines).
    isolates_rejections = True
    progress_type = TracesUpload
    # prepare reads nothing send changes (``ship.early``): the next batch is
    # stamped and gzipped while this one uploads.
    prepares_while_sending = True

    def __init__(
        self,
        client: PlatformClient | None,
        *,
        context: Mapping[str, str],
        opted_out: bool = False,
        committed: int = 0,
        line: Callable[[Entry, Binding], Line] | None = None,
    ) -> None:
        """``line``: an entry's line (the shipper's, made once with the other
        sinks' forms of the entry: ``ship.parsed``; default: made here)."""
        self._client = client
        self._line = line or _line_here
        self._metadata: dict[str, Any] = {"schema_version": 1}
        if context:
            self._metadata["context"] = dict(context)
        self._opted_out = opted_out
        # Receipts already committed for this run, by this or an earlier process.
        self.committed = committed

    def prepare(self, entries: Sequence[Entry], binding: Binding) -> Prepared[TracesUpload] | None:
        if self._opted_out or self._client is None:
            raise SinkOff("opted out of Prime Traces")
        kind = entries[0].kind
        lines: list[bytes] = []
        size = 0
        nonempty = 0
        last_seq = entries[0].seq
        for entry in entries:
            if entry.kind is not kind:
                break  # one line format per upload
            try:
                made = self._line(entry, binding)
                if kind is EntryKind.EPISODE and made.with_traces is None:
                    raise TypeError(f"journal entry {entry.seq} holds no episode object")
            except Exception:
                # The shipper fails the first entry of a batch whose prepare
                # raises: ship what came before; this one fails alone.
                if lines:
                    break
                raise
            line = made.line
            if len(line) > MAX_LINE_BYTES:
                if lines:
                    break  # ship what came before; this one fails alone
                raise TraceTooLargeError(1, len(line), MAX_LINE_BYTES)
            if lines and size + len(line) + 1 > TARGET_BATCH_BYTES:
                break
            lines.append(line)
            size += len(line) + 1
            last_seq = entry.seq
            if kind is EntryKind.EPISODE:
                nonempty += made.with_traces or 0
        # One join, every line followed by its LF: joining then appending the
        # last LF copied the whole JSONL (30 MB) a second time, into fresh pages.
        records = len(lines)
        lines.append(b"")
        jsonl = b"\n".join(lines)
        body, content_type, key = multipart_body(jsonl, self._metadata)
        return Prepared(
            body=body,
            records=records,
            progress=TracesUpload(content_type, key, episode=kind is EntryKind.EPISODE),
            last_seq=None if last_seq == entries[-1].seq else last_seq,
            counters={"episodes_written": nonempty, "traces_receipts": 1},
        )

    def send(self, body: bytes, ctx: SendContext[TracesUpload]) -> None:
        if self._client is None:
            raise SinkOff("opted out of Prime Traces")
        upload = ctx.progress
        headers = {"Content-Type": upload.content_type, "Idempotency-Key": upload.key}
        if upload.episode:
            headers["X-Prime-Line-Format"] = "episode"
        try:
            receipt = self._client.traces("POST", "/traces", content=body, headers=headers)
        except ForbiddenError as exc:
            if exc.code == "service_not_enabled" and self.committed == 0:
                raise SinkOff("Prime Traces is not enabled for this account") from exc
            raise
        # No receipt (an empty 200, a proxy's page), not committed or another
        # upload's: not stored as far as we can tell. Resending the same bytes
        # is safe (the service answers a replay with the receipt it committed).
        receipts.check_traces(receipt, upload.key)
        self.committed += 1

    def set_apart(self, body: bytes, progress: TracesUpload, exc: BaseException) -> list[int]:
        """The 1-based lines of a recorded upload the service refused for a
        repeated id (``repeated_ids``) to set apart, so the rest goes in one
        request; empty for any other refusal, or a body that is not this
        sink's upload (the shipper then halves the batch)."""
        code = getattr(exc, "code", None)
        role = repeated_ids.DUPLICATE_CODES.get(code) if isinstance(code, str) else None
        if not isinstance(exc, ValidationRejectedError) or role is None:
            return []
        jsonl = _jsonl_of(body, progress)
        if jsonl is None:
            return []
        named = repeated_ids.named_ids(str(exc))
        return repeated_ids.lines_to_set_apart(
            jsonl, episode=progress.episode, named=named, role=role
        )


def _jsonl_of(body: bytes, progress: TracesUpload) -> bytes | None:
    """The JSONL an upload made by ``multipart_body`` carries, checked against
    its Idempotency-Key; None if the body is not such an upload (a journal
    is untrusted input)."""
    boundary = progress.content_type.partition("boundary=")[2].encode()
    head = _TRACES_PART_HEAD
    start = body.find(head)
    tail = b"\r\n--" + boundary + b"--\r\n"
    if not boundary or start < 0 or not body.endswith(tail):
        return None
    inflate = zlib.decompressobj(_GZIP_WBITS)
    try:
        # Never more than the service takes in one upload, whatever the gzip says.
        jsonl = inflate.decompress(body[start + len(head) : -len(tail)], _MAX_UPLOAD_BYTES)
    except zlib.error:
        return None
    if inflate.unconsumed_tail or f"sha256:{hashlib.sha256(jsonl).hexdigest()}" != progress.key:
        return None
    return jsonl


def _line_here(entry: Entry, binding: Binding) -> Line:
    return line_of(parse_entry(entry), binding)
