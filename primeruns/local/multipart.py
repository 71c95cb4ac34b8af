"""A strict multipart/form-data reader for trace uploads.

Starlette's form parser turns part bodies without a filename into text and
drops part headers; the traces upload needs the raw bytes and the per-part
``Content-Encoding`` header, and a bounded number of parts. This reads a body
already held in memory (the route caps its size first) with python-multipart.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

MAX_PARTS = 16


class MultipartError(ValueError):
    """The body is not well-formed multipart/form-data."""


@dataclass
class Part:
    """One part: its lower-cased headers, form name, filename and raw bytes."""

    headers: dict[str, str] = field(default_factory=dict)
    name: str | None = None
    filename: str | None = None
    data: bytearray = field(default_factory=bytearray)


def boundary_of(content_type: str) -> bytes | None:
    """The boundary of a ``multipart/form-data`` content type, else None."""
    kind, params = parse_options_header(content_type)
    if kind.lower() != b"multipart/form-data":
        return None
    boundary = params.get(b"boundary")
    return boundary or None


def parse_parts(boundary: bytes, body: bytes) -> list[Part]:
    """Split ``body`` into parts; raises MultipartError on any malformation."""
    parts: list[Part] = []
    current = Part()
    header_field = bytearray()
    header_value = bytearray()
    finished = False

    def on_part_begin() -> None:
        nonlocal current
        if len(parts) >= MAX_PARTS:
            raise MultipartError(f"more than {MAX_PARTS} parts")
        current = Part()
        parts.append(current)

    def on_part_data(data: bytes, start: int, end: int) -> None:
        current.data += data[start:end]

    def on_header_field(data: bytes, start: int, end: int) -> None:
        header_field.extend(data[start:end])

    def on_header_value(data: bytes, start: int, end: int) -> None:
        header_value.extend(data[start:end])

    def on_header_end() -> None:
        name = header_field.decode("latin-1").strip().lower()
        current.headers[name] = header_value.decode("latin-1").strip()
        header_field.clear()
        header_value.clear()

    def on_headers_finished() -> None:
        _, options = parse_options_header(current.headers.get("content-disposition", ""))
        if b"name" not in options:
            raise MultipartError("a part has no Content-Disposition name")
        current.name = options[b"name"].decode("utf-8", "replace")
        if b"filename" in options:
            current.filename = options[b"filename"].decode("utf-8", "replace")

    def on_end() -> None:
        nonlocal finished
        finished = True

    callbacks = {
        "on_part_begin": on_part_begin,
        "on_part_data": on_part_data,
        "on_header_field": on_header_field,
        "on_header_value": on_header_value,
        "on_header_end": on_header_end,
        "on_headers_finished": on_headers_finished,
        "on_end": on_end,
    }
    try:
        parser = MultipartParser(boundary, callbacks)  # type: ignore[arg-type]
        parser.write(body)
        parser.finalize()
    except FormParserError as exc:
        raise MultipartError(f"malformed multipart body: {exc}") from None
    if not finished:
        raise MultipartError("multipart body ends before its closing boundary")
    return parts
