"""Keys never come back (issue #27): a redirect, a server echoing the
Authorization header, a URL setting with ``user:pass@`` and the journal probe's
child must not carry the API key anywhere it does not belong."""

from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import sys
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import httpx
import pytest
import workloads
from sdk_helpers import point_at

import primeruns as pr
from primeruns import exceptions as ex
from primeruns.journal import probe
from primeruns.platform import PlatformClient, resolve_settings
from primeruns.ship import ledger, uplink
from primeruns.ship.ledger import record_error

KEY = "pk-live-Zq8XvN3hT5wR7yLm2Kc9"


def _client(base_url: str, handler: Any) -> PlatformClient:
    settings = resolve_settings(api_key=KEY, base_url=base_url, environ={}, config={})
    return PlatformClient(settings, transport=httpx.MockTransport(handler))


# -- redirects ---------------------------------------------------------------------


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
@pytest.mark.parametrize(
    "target",
    [
        "https://internal.example/api/internal/evaluations",  # another origin
        "http://platform.example/api/internal/evaluations",  # a downgrade to http
        "https://platform.example/api/internal/elsewhere",  # even the same origin
    ],
)
def test_an_api_call_never_follows_a_redirect(status: int, target: str) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.host == "platform.example" and request.url.path.endswith("evaluations"):
            return httpx.Response(status, headers={"Location": target})
        return httpx.Response(200, json={"ok": True})

    client = _client("https://platform.example/api/internal", handler)
    with pytest.raises(ex.APIError) as caught:
        client.api("POST", "/evaluations", {"secret_body": 1})
    # One request, to the configured origin: no credential header and no body
    # went to where the redirect pointed.
    assert [str(r.url) for r in seen] == ["https://platform.example/api/internal/evaluations"]
    assert seen[0].headers["x-api-key"] == KEY  # it was sent where it belongs
    text = str(caught.value)
    assert target in text  # the error names where it pointed
    assert KEY not in text


def test_a_redirect_error_names_the_target_without_its_credentials() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        location = f"https://user:pw@internal.example/x?token={KEY}"
        return httpx.Response(307, headers={"Location": location})

    client = _client("https://platform.example", handler)
    with pytest.raises(ex.APIError) as caught:
        client.api("GET", "/evaluations")
    text = str(caught.value)
    assert "internal.example/x" in text
    assert "user:pw" not in text and KEY not in text


def test_a_traces_call_never_follows_a_redirect() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(308, headers={"Location": "http://elsewhere.example/api/v1/traces"})

    client = _client("https://platform.example", handler)
    with pytest.raises(ex.APIError):
        client.traces("POST", "/traces", content=b"body")
    assert len(seen) == 1 and seen[0].url.scheme == "https"  # the configured traces URL


# -- server text echoing the key ---------------------------------------------------

ECHOES = [
    b'{"detail": "bad request; headers: Authorization: Bearer %s"}',
    b'{"error": {"code": "x", "message": "x-api-key=%s"}}',
    b"<html><pre>authorization: Bearer %s\nX-Api-Key: %s</pre></html>",
    b"token %s was not accepted",
]


@pytest.mark.parametrize("body", ECHOES)
@pytest.mark.parametrize("status", [400, 401, 409, 418, 502])
def test_an_error_body_echoing_the_key_is_scrubbed(body: bytes, status: int) -> None:
    echoed = body.replace(b"%s", KEY.encode())

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=echoed)

    client = _client("https://platform.example/api/internal", handler)
    with pytest.raises(ex.APIError) as caught:
        client.api("POST", "/evaluations", {"a": 1})
    assert KEY not in str(caught.value) and KEY not in repr(caught.value.args)
    with pytest.raises(ex.APIError) as caught:
        client.traces("POST", "/traces", content=b"x")
    assert KEY not in str(caught.value)


@pytest.mark.parametrize("before", [470, 480])
def test_a_key_echoed_where_a_long_answer_is_cut_leaves_no_part_of_it(before: int) -> None:
    """A text answer is cut to its first 500 characters for the message: cut
    before it was scrubbed, a key echoed across the cut was no longer there
    whole to be masked, and its first characters went into the error."""
    echoed = b"x" * before + b" unknown " + KEY.encode()

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(401, content=echoed, headers={"content-type": "text/plain"})

    client = _client("https://platform.example/api/internal", handler)
    with pytest.raises(ex.APIError) as caught:
        client.api("POST", "/evaluations", {"a": 1})
    shown = str(caught.value)
    assert "unknown" in shown
    assert not [KEY[:end] for end in range(len("pk-live-") + 1, len(KEY)) if KEY[:end] in shown]


@pytest.mark.parametrize("blanks", [" ", "\t", " \t"])
def test_a_key_with_blanks_before_it_echoed_without_them_is_scrubbed(blanks: str) -> None:
    """A key pasted with a blank before it is sent (``Bearer  <key>``: blanks
    between words, which h11 takes); the server reads the key without them,
    and echoes it so, quoted: that is the key too."""

    def handler(request: httpx.Request) -> httpx.Response:
        got = request.headers["authorization"].split(None, 1)[1].strip()
        return httpx.Response(401, json={"detail": f'no such key "{got}"'})

    settings = resolve_settings(
        api_key=blanks + KEY, base_url="https://platform.example/api/v1", environ={}, config={}
    )
    client = PlatformClient(settings, transport=httpx.MockTransport(handler))
    with pytest.raises(ex.APIError) as caught:
        client.api("POST", "/rft/metrics", {"run_id": "r"})
    assert "no such key" in str(caught.value) and KEY not in str(caught.value)


def test_the_journal_never_records_a_key_in_an_error(tmp_path: Path) -> None:
    """The last line of defence: an exception whose text holds the key (from
    wherever) is scrubbed as the uplink records it."""
    from primeruns.journal import Journal

    resolve_settings(api_key=KEY, environ={}, config={})  # the process knows its key
    journal = Journal.create(tmp_path)
    try:
        record_error(journal, "ship", RuntimeError(f"proxy said: Authorization: Bearer {KEY}"))
        record_error(journal, "ship", RuntimeError(f"raw {KEY} here"))
        ledger.record_standing(
            journal, "traces", off=None, retired=f"3 failed: {KEY}", paused_for=None
        )
        recorded = ledger.read_errors(journal)
        assert KEY not in str(ledger.read_standing(journal, "traces"))
    finally:
        journal.close()
    assert len(recorded) == 2
    assert all(KEY not in str(e) for e in recorded)
    for name in os.listdir(journal.path):
        assert KEY.encode() not in (journal.path / name).read_bytes()


@pytest.mark.parametrize("filler", [0, 170])
def test_a_traces_receipt_echoing_the_key_is_scrubbed(filler: int) -> None:
    """A 200 is server text too: a receipt that is not one is quoted, scrubbed
    whole before it is cut short (a key across the cut is masked, not shown in part)."""
    from scripted_platform import Batch, ScriptedPlatform, entries_of

    from primeruns.journal import EntryKind
    from primeruns.sinks.base import Binding
    from primeruns.sinks.traces import TracesSink

    resolve_settings(api_key=KEY, environ={}, config={})  # the process knows its key
    platform = ScriptedPlatform()
    platform.route(
        "upload",
        "POST",
        "/api/v1/traces",
        lambda request, _: httpx.Response(200, json={"status": f"echo {'x' * filler} {KEY}"}),
    )
    sink = TracesSink(platform.client(), context={"source": "unit-test"})
    batch = Batch.prepare(
        sink,
        entries_of(EntryKind.EPISODE, workloads.gsm8k(1)),
        Binding(run_id="eval-1", kind="eval"),
    )
    with pytest.raises(ex.RetryableAPIError) as caught:
        batch.send(sink)
    assert "echo" in str(caught.value) and KEY not in str(caught.value)
    assert KEY[: len("pk-live-") + 1] not in str(caught.value)


class _EchoingProxy(httpx.BaseTransport):
    """The platform behind a proxy whose debug page echoes the request's
    headers on the evaluation samples route."""

    def __init__(self) -> None:
        self._real = httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/samples") and request.method == "POST":
            headers = "\n".join(f"{k}: {v}" for k, v in request.headers.items())
            return httpx.Response(400, text=f"<pre>debug: request headers\n{headers}</pre>")
        return self._real.handle_request(request)

    def close(self) -> None:
        self._real.close()


def test_a_key_echoed_by_a_proxy_is_nowhere_the_user_looks(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    monkeypatch.setenv("PRIME_RUNS_UPLINK", "threads")  # the uplink's logs land in caplog
    proxy = _EchoingProxy()
    monkeypatch.setattr(
        uplink, "PlatformClient", lambda settings: PlatformClient(settings, transport=proxy)
    )
    caplog.set_level(logging.DEBUG)
    try:
        run = pr.init(
            environments=["gsm8k"], api_key=KEY, base_url=local_platform.url, runs_dir=runs
        )
        run.log_episodes(workloads.gsm8k(3))
        run.finish(timeout=60)
    finally:
        proxy.close()
    assert run.errors, "the proxy's 400 should be reported"
    assert any("debug" in e for e in run.errors)  # its text is kept, the key is not
    assert all(KEY not in e for e in run.errors)
    assert KEY not in caplog.text
    journal = run.journal_path
    assert journal is not None
    for name in os.listdir(journal):
        assert KEY.encode() not in (journal / name).read_bytes(), name
    for extra in ([], ["--json"]):
        shown = subprocess.run(
            [sys.executable, "-m", "primeruns", "show", str(journal), *extra],
            capture_output=True,
            check=False,
        )
        assert KEY.encode() not in shown.stdout + shown.stderr


# -- URL settings with credentials -------------------------------------------------


@pytest.mark.parametrize("key", ["traces_url", "frontend_url", "base_url"])
def test_a_url_with_credentials_in_the_config_file_is_refused(key: str) -> None:
    config = {key: "https://user:hunter2@platform.example"}
    with pytest.raises(ex.ConfigurationError) as caught:
        resolve_settings(api_key=KEY, environ={}, config=config)
    text = str(caught.value)
    assert key in text and "config" in text and "credentials" in text
    assert "hunter2" not in text


@pytest.mark.parametrize("var", ["PRIME_TRACES_URL", "PRIME_FRONTEND_URL", "PRIME_API_BASE_URL"])
def test_a_url_with_credentials_in_the_environment_is_refused(var: str) -> None:
    with pytest.raises(ex.ConfigurationError) as caught:
        resolve_settings(api_key=KEY, environ={var: "https://user:hunter2@x.example"}, config={})
    assert var in str(caught.value) and "hunter2" not in str(caught.value)


def test_a_disabled_run_only_warns_about_a_url_with_credentials(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = {"frontend_url": "https://user:hunter2@platform.example"}
    with caplog.at_level(logging.WARNING, logger="primeruns"):
        settings = resolve_settings(api_key=KEY, environ={}, config=config, strict=False)
    assert "hunter2" not in settings.frontend_url
    assert "frontend_url" in caplog.text and "hunter2" not in caplog.text


def test_doctor_never_prints_a_url_credential(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".prime").mkdir(parents=True)
    (home / ".prime" / "config.json").write_text(
        '{"traces_url": "https://user:hunter2@traces.example"}'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIME_")}
    env.update(HOME=str(home), PRIME_RUNS_DIR=str(tmp_path / "runs"))
    done = subprocess.run(
        [sys.executable, "-m", "primeruns", "doctor", "--timeout", "1"],
        capture_output=True,
        env=env,
        check=False,
        timeout=120,
    )
    out = done.stdout + done.stderr
    assert b"hunter2" not in out
    assert b"traces_url" in out


# -- the probe's child -------------------------------------------------------------


def test_the_probe_child_does_not_inherit_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from primeruns.journal import Journal

    journal = Journal.create(tmp_path)
    journal.close()
    for var in ("PRIME_API_KEY", "OPENAI_API_KEY", "HF_TOKEN", "WANDB_API_KEY", "GITHUB_TOKEN"):
        monkeypatch.setenv(var, KEY)
    real = subprocess.run
    envs: list[Any] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        envs.append(kwargs.get("env"))
        return real(*args, **kwargs)

    monkeypatch.setattr(subprocess, "run", spy)  # (the probe imports it to start a child)
    monkeypatch.setattr(probe, "_known", OrderedDict())  # (no verdict kept: it walks)
    assert probe.probe(journal.path) is None  # it still reads the journal
    assert envs and envs[0] is not None, "the child inherits the whole environment"
    assert KEY not in envs[0].values()
    assert envs[0].get("PATH") == os.environ.get("PATH")  # the rest is kept


# -- fork ----------------------------------------------------------------------------


def test_a_child_forked_while_a_thread_scrubs_scrubs_its_own_errors() -> None:
    """A run's uplink threads (a run kept in memory, an evaluation's first
    seconds) scrub each failure's text under the module's lock. A child
    forked while one held it got the lock held for good: its own first
    failure (its uplink threads' of its own journal in memory) waited on it
    for ever."""
    from primeruns import redaction

    redaction.remember_secret(KEY)
    holding, release = threading.Event(), threading.Event()

    def scrubbing() -> None:
        with redaction._lock:  # a thread inside scrub() at the fork
            holding.set()
            release.wait()

    thread = threading.Thread(target=scrubbing)
    thread.start()
    holding.wait()
    said_r, said_w = os.pipe()
    try:
        pid = os.fork()
        if pid == 0:
            try:
                os.write(said_w, redaction.scrub(f"echoed {KEY}").encode())
            finally:
                os._exit(0)
        said = select.select([said_r], [], [], 60)[0]  # a hang's bound, not a race
        if not said:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    finally:
        release.set()
        thread.join()
    assert said
    scrubbed = os.read(said_r, 200)
    assert KEY.encode() not in scrubbed and scrubbed.startswith(b"echoed")
