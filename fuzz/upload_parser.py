"""Fuzz the local platform's trace-upload parser: any request must be accepted
or refused with TracesError (a 4xx the client can read), nothing else.

Run (from the repository root, after ``pip install atheris``)::

    python fuzz/upload_parser.py fuzz/corpus/upload_parser -max_total_time=60 \
        -rss_limit_mb=4096 -artifact_prefix=/tmp/

(CI: ``-max_total_time=30``; on demand, longer.) The first input byte picks a
mode: *raw* feeds the remaining bytes as the whole multipart body under a
fuzzed boundary, reaching the multipart reader and the framing checks; *lines*
wraps them as the ``traces`` part of a well-formed upload (gzip or not, with a
matching Idempotency-Key) so mutations reach line validation and row staging.
``python fuzz/upload_parser.py --make-corpus DIR`` writes the seed corpus.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
from pathlib import Path

import atheris

# Instrumented: the package and the multipart reader it calls. Instrumenting
# every module the import pulls in (asyncio, ssl, pydantic, ...) took most of
# a bounded run's time, and the seed corpus reaches the same coverage without.
with atheris.instrument_imports(include=["primeruns", "python_multipart"]):
    from primeruns.local.errors import TracesError
    from primeruns.local.traces_ingest import stage_rows, verify_request

BOUNDARY = "fuzzboundary"


def wrap(payload: bytes, *, gzipped: bool, line_format: str = "trace") -> tuple[str, bytes, str]:
    """A well-formed upload of ``payload``: (content type, body, Idempotency-Key)."""
    data = gzip.compress(payload) if gzipped else payload
    encoding = b"Content-Encoding: gzip\r\n" if gzipped else b""
    meta = json.dumps({"schema_version": 1, "context": {"run_id": "r"}}).encode()
    body = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="metadata"\r\n\r\n'.encode()
        + meta
        + f'\r\n--{BOUNDARY}\r\nContent-Disposition: form-data; name="traces"; '
        f'filename="traces.jsonl"\r\n'.encode()
        + encoding
        + b"\r\n"
        + data
        + f"\r\n--{BOUNDARY}--\r\n".encode()
    )
    key = "sha256:" + hashlib.sha256(payload).hexdigest()
    return f"multipart/form-data; boundary={BOUNDARY}", body, key


def check(content_type: str, body: bytes, key: str, line_format: str) -> None:
    try:
        upload = verify_request(
            content_type=content_type, body=body, key_header=key, format_header=line_format
        )
        stage_rows(upload, 1_700_000_000.0)
    except TracesError as exc:
        if not 400 <= exc.status < 500:
            raise AssertionError(f"a bad upload answered {exc.status}") from exc


def test_one_input(data: bytes) -> None:
    if not data:
        return
    fdp = atheris.FuzzedDataProvider(data)
    mode = fdp.ConsumeIntInRange(0, 3)
    line_format = "episode" if fdp.ConsumeBool() else "trace"
    if mode == 0:
        # A header reaches the app latin-1 decoded (as Starlette does), so any
        # byte may appear but no character above U+00FF.
        boundary = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 70)).decode("latin-1")
        body = fdp.ConsumeBytes(fdp.remaining_bytes())
        key = "sha256:" + hashlib.sha256(body).hexdigest()
        check(f"multipart/form-data; boundary={boundary}", body, key, line_format)
    else:
        payload = fdp.ConsumeBytes(fdp.remaining_bytes())
        content_type, body, key = wrap(payload, gzipped=mode == 2)
        check(content_type, body, key, line_format)


def make_corpus(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    trace = {"id": "t1", "version": 1, "timing": {"start": 1.0, "end": 2.0}, "messages": []}
    episode = {"id": "e1", "traces": [trace], "env": {"id": "gsm8k"}}
    seeds = {
        "trace-plain": b"\x01\x00" + json.dumps(trace).encode() + b"\n",
        "trace-gzip": b"\x02\x00" + json.dumps(trace).encode() + b"\n",
        "episode": b"\x01\x01" + json.dumps(episode).encode() + b"\n",
        "raw": b"\x00\x00\x0cfuzzboundary" + wrap(b"{}\n", gzipped=False)[1],
    }
    for name, blob in seeds.items():
        (out / name).write_bytes(blob)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--make-corpus":
        make_corpus(Path(sys.argv[2]))
        return
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
