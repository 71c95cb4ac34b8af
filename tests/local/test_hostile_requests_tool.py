"""tools/security/hostile_requests.py, the review's hostile requests (#27) as
a tool to run by hand against ``primeruns serve``: every check passes
against the local platform as it is, and fails against a platform that
answers everything, as the local platform did before #27."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from primeruns.local import LocalPlatform

TOOL = Path(__file__).resolve().parents[2] / "tools" / "security" / "hostile_requests.py"
KEY = "the-local-key-456"


def _run(*args: str, key: str | None = None) -> tuple[int, dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if k != "PRIMERUNS_LOCAL_API_KEY"}
    if key:
        env["PRIMERUNS_LOCAL_API_KEY"] = key
    done = subprocess.run(
        [sys.executable, str(TOOL), *args], capture_output=True, text=True, env=env, timeout=300
    )
    assert "Traceback" not in done.stderr, done.stderr
    verdicts = {}
    for line in done.stdout.splitlines():
        verdict, _, rest = line.partition("  ")
        verdicts[rest.strip().split("  ")[0]] = verdict.strip()
    return done.returncode, verdicts


def test_every_hostile_request_gets_the_answer_it_must(
    make_local_platform: Callable[..., LocalPlatform],
) -> None:
    p = make_local_platform(api_key=KEY)
    code, verdicts = _run("--url", p.url, "--pid", str(p.pid), "--bomb-mib", "64", key=KEY)
    assert verdicts == dict.fromkeys(
        ["no key", "bad Host", "form CSRF", "deep JSON", "gzip bomb", "redirects"], "PASS"
    )
    assert code == 0
    assert p.set_faults()["latency_ms"] == 0  # the refused hour of latency changed nothing


class _AnswersEverything(http.server.BaseHTTPRequestHandler):
    """A platform with no guard: 200 and an empty JSON object to anything."""

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b'{"latency_ms": 3600000}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def unguarded() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AnswersEverything)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_tool_fails_a_platform_that_answers_everyone(unguarded: str) -> None:
    only = ("no-key", "bad-host", "form-csrf", "deep-json")
    code, verdicts = _run("--url", unguarded, *(f"--only={c}" for c in only), key=KEY)
    assert code == 1
    assert verdicts == dict.fromkeys(["no key", "bad Host", "form CSRF", "deep JSON"], "FAIL")
