"""Hostile requests against the local platform, as the security review sent them.

Each generator returns bytes and headers, not a response, so that a test (or
``tools/security/hostile_requests.py``) decides where to send them. They are
cheap to build: the gzip bomb is compressed from a repeated chunk, never held
uncompressed.
"""

from __future__ import annotations

import hashlib
import zlib

BOUNDARY = "hostile-boundary"


def newline_gzip_bomb(size: int) -> tuple[bytes, str]:
    """``size`` bytes of newlines, gzip-compressed (about 1/1000 of ``size``),
    and the Idempotency-Key of the uncompressed bytes (so it passes the digest
    check and reaches the line splitter)."""
    chunk = b"\n" * (1 << 20)
    deflater = zlib.compressobj(9, zlib.DEFLATED, 31)
    digest = hashlib.sha256()
    parts: list[bytes] = []
    left = size
    while left > 0:
        piece = chunk[: min(left, len(chunk))]
        digest.update(piece)
        parts.append(deflater.compress(piece))
        left -= len(piece)
    parts.append(deflater.flush())
    return b"".join(parts), "sha256:" + digest.hexdigest()


def traces_upload(
    payload: bytes, key: str, *, gzipped: bool = True
) -> tuple[bytes, dict[str, str]]:
    """A Prime Traces upload request (body, headers) carrying ``payload`` as its traces part."""
    encoding = b"Content-Encoding: gzip\r\n" if gzipped else b""
    b = BOUNDARY.encode()
    body = (
        b"--" + b + b"\r\n"
        b'Content-Disposition: form-data; name="metadata"\r\n'
        b"Content-Type: application/json\r\n\r\n"
        b'{"schema_version": 1}\r\n'
        b"--" + b + b"\r\n"
        b'Content-Disposition: form-data; name="traces"; filename="traces.jsonl"\r\n'
        b"Content-Type: application/x-ndjson\r\n" + encoding + b"\r\n" + payload + b"\r\n"
        b"--" + b + b"--\r\n"
    )
    headers = {
        "Content-Type": f"multipart/form-data; boundary={BOUNDARY}",
        "Idempotency-Key": key,
    }
    return body, headers


def nested_json(depth: int) -> bytes:
    """A JSON object whose one field nests ``depth`` arrays deep."""
    return b'{"environments": ' + b"[" * depth + b"]" * depth + b"}"


def nested_trace_line(depth: int) -> bytes:
    """One JSONL line: an object nesting ``depth`` objects deep."""
    return b'{"a":' * depth + b"1" + b"}" * depth + b"\n"


def cross_site_form_post(origin: str = "http://evil.example") -> dict[str, str]:
    """The headers a browser sends for an empty ``<form method=post>`` submitted
    from another site (the body is empty)."""
    return {
        "Content-Type": "application/x-www-form-urlencoded",
        "Origin": origin,
        "Sec-Fetch-Site": "cross-site",
    }
