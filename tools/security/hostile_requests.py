"""Hostile requests against a local platform, as the security review of #27
sent them, and what each must get back.

The generators build requests (bytes and headers) without sending them; the
tests send them too (tests/local/hostile.py). Run by hand against
``primeruns serve``::

    PRIMERUNS_LOCAL_API_KEY=K primeruns serve --port 8000 &
    PRIMERUNS_LOCAL_API_KEY=K python tools/security/hostile_requests.py \\
        --url http://127.0.0.1:8000 [--pid PID] [--bomb-mib 256]

Each check prints a line, PASS, FAIL or SKIP, with what came back; the exit
status is 1 if any failed. The checks: every route without the key (401, and
an hour of injected latency refused), a Host header naming another site
(400: DNS rebinding), a cross-site form post (403 or 415: CSRF), JSON nested
deeper than the platform's limit (422 naming it), a gzip bomb of newlines
(answered, the platform still up, and with ``--pid`` its peak memory grown
by less than twice the bomb), and, with no platform needed, the SDK's API
client answered by redirects to another origin and to http (followed
nowhere: the key stays home). Without a key the platform answers anyone on
loopback: the key check is skipped, the rest still run.
"""

from __future__ import annotations

import argparse
import hashlib
import http.server
import os
import sys
import threading
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

BOUNDARY = "hostile-boundary"
KEY_ENV = "PRIMERUNS_LOCAL_API_KEY"
MIB = 1024 * 1024


# -- generators ----------------------------------------------------------------------


def newline_gzip_bomb(size: int) -> tuple[bytes, str]:
    """``size`` bytes of newlines, gzip-compressed (about 1/1000 of ``size``),
    and the Idempotency-Key of the uncompressed bytes (so it passes the digest
    check and reaches the line splitter). Compressed from a repeated chunk,
    never held uncompressed."""
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


# -- the driver ----------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    check: str
    verdict: str  # PASS, FAIL or SKIP
    detail: str


@dataclass(frozen=True)
class Target:
    url: str
    key: str | None
    pid: int | None
    bomb: int

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def check_no_key(t: Target) -> Finding:
    if not t.key:
        r = httpx.get(f"{t.url}/_local/runs", timeout=10)
        if r.status_code == 401:
            why = f"refused without a key; give it in {KEY_ENV} for the other checks"
            return Finding("no key", "PASS", why)
        why = "no key given: a platform without one answers anyone on loopback"
        return Finding("no key", "SKIP", f"{why} (/_local/runs: {r.status_code})")
    answers = {
        path: httpx.get(f"{t.url}{path}", timeout=10).status_code
        for path in ("/", "/_local/runs", "/_local/faults", "/api/v1/evaluations/x")
    }
    stall = httpx.post(f"{t.url}/_local/faults", json={"latency_ms": 3_600_000}, timeout=10)
    answers["POST /_local/faults"] = stall.status_code
    latency = httpx.get(f"{t.url}/_local/faults", headers=t.auth, timeout=10).json()
    if latency.get("latency_ms"):  # it got in: take the hour of latency back out
        httpx.post(f"{t.url}/_local/faults", json={"latency_ms": 0}, headers=t.auth, timeout=10)
    ok = all(code == 401 for code in answers.values()) and latency.get("latency_ms") == 0
    return Finding("no key", _verdict(ok), f"{answers}, latency now {latency.get('latency_ms')}")


def check_bad_host(t: Target) -> Finding:
    port = httpx.URL(t.url).port
    answers = {
        host: httpx.get(f"{t.url}/healthz", headers={"Host": host}, timeout=10).status_code
        for host in ("evil.example", f"evil.example:{port}", "127.0.0.2")
    }
    return Finding("bad Host", _verdict(all(c == 400 for c in answers.values())), str(answers))


def check_form_csrf(t: Target) -> Finding:
    # An evaluation that does not exist: a 404 would mean the form reached
    # the route (and would finalize a real one); the guard answers first.
    finalize = f"{t.url}/api/v1/evaluations/hostile-probe/finalize"
    r = httpx.post(finalize, headers={**t.auth, **cross_site_form_post()}, timeout=10)
    same_site = httpx.post(
        finalize,
        headers={**t.auth, "Content-Type": "application/x-www-form-urlencoded"},
        timeout=10,
    )
    codes = (r.status_code, same_site.status_code)
    ok = r.status_code in (403, 415) and same_site.status_code == 415
    return Finding("form CSRF", _verdict(ok), f"cross-site, same-site form: {codes}")


def check_deep_json(t: Target) -> Finding:
    answers = []
    for depth in (200, 100_000):
        r = httpx.post(
            f"{t.url}/api/v1/evaluations/",
            content=nested_json(depth),
            headers={**t.auth, "Content-Type": "application/json"},
            timeout=30,
        )
        named = r.status_code == 422 and "nest" in r.text
        answers.append((depth, r.status_code, named))
    return Finding("deep JSON", _verdict(all(a[2] for a in answers)), str(answers))


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


def check_gzip_bomb(t: Target) -> Finding:
    payload, key = newline_gzip_bomb(t.bomb)
    body, headers = traces_upload(payload, key)
    before = _peak_rss(t.pid) if t.pid else 0
    r = httpx.post(
        f"{t.url}/api/v1/traces", content=body, headers={**t.auth, **headers}, timeout=300
    )
    alive = httpx.get(f"{t.url}/healthz", timeout=10).status_code == 200
    ok = r.status_code in (201, 400) and alive
    detail = (
        f"{len(payload) // 1024} KiB inflating to {t.bomb // MIB} MiB: {r.status_code}, "
        f"alive {alive}"
    )
    if t.pid:
        grown = _peak_rss(t.pid) - before
        ok = ok and grown < 2 * t.bomb
        detail += f", peak RSS +{grown / MIB:.0f} MiB"
    return Finding("gzip bomb", _verdict(ok), detail)


class _Redirector(http.server.BaseHTTPRequestHandler):
    """Answers every request with a redirect to ``location``; records who came."""

    location = ""
    seen: list[dict[str, str]]

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.seen.append({k.lower(): v for k, v in self.headers.items()})
        self.send_response(307)
        self.send_header("Location", self.location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = do_PUT = _answer

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass


@contextmanager
def _redirecting(location: str) -> Iterator[tuple[str, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []
    handler = type("Handler", (_Redirector,), {"location": location, "seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def check_redirects(_: Target | None = None) -> Finding:
    """The SDK's API client against a platform that redirects: the second
    origin (another port, then another host) must never be asked."""
    from primeruns import exceptions
    from primeruns.platform import PlatformClient, resolve_settings

    key = "pk-hostile-probe-key"
    with _redirecting("http://127.0.0.1:9/nowhere") as (elsewhere, reached):
        answers = []
        for location in (f"{elsewhere}/api/internal/evaluations", "http://localhost:9/x"):
            with _redirecting(location) as (platform, first):
                settings = resolve_settings(
                    api_key=key, base_url=f"{platform}/api/internal", environ={}, config={}
                )
                client = PlatformClient(settings)
                try:
                    client.api("POST", "/evaluations", {"body": 1})
                    answers.append("followed")
                except exceptions.APIError as exc:
                    leaked = key in str(exc)
                    answers.append(f"refused{' (key in the error)' if leaked else ''}")
                finally:
                    client.close()
                answers.append(f"asked {len(first)}x")
    ok = not reached and all(a in ("refused", "asked 1x") for a in answers)
    return Finding("redirects", _verdict(ok), f"{answers}, other origin asked {len(reached)}x")


CHECKS: dict[str, Callable[[Target], Finding]] = {
    "no-key": check_no_key,
    "bad-host": check_bad_host,
    "form-csrf": check_form_csrf,
    "deep-json": check_deep_json,
    "gzip-bomb": check_gzip_bomb,
    "redirects": check_redirects,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="the local platform (omit: the redirect check alone)")
    parser.add_argument("--pid", type=int, help="its process, to measure the bomb's cost")
    parser.add_argument("--bomb-mib", type=int, default=256, help="the bomb's inflated size")
    parser.add_argument("--only", action="append", choices=sorted(CHECKS), help="repeatable")
    args = parser.parse_args(argv)
    target = Target(
        url=(args.url or "").rstrip("/"),
        key=os.environ.get(KEY_ENV) or None,  # never on the command line
        pid=args.pid,
        bomb=args.bomb_mib * MIB,
    )
    names = args.only or (list(CHECKS) if args.url else ["redirects"])
    failed = 0
    for name in names:
        try:
            finding = CHECKS[name](target)
        except (httpx.HTTPError, OSError, ValueError) as exc:
            finding = Finding(name, "FAIL", f"{type(exc).__name__}: {exc}")
        failed += finding.verdict == "FAIL"
        print(f"{finding.verdict:4}  {finding.check:10}  {finding.detail}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
