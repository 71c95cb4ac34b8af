"""The local platform answers only whom it should (issue #27): the key on every
route, a one-time login link for the dashboard, loopback Host names, no binding
beyond loopback without a key, no cross-site form posts, framing headers."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import procs
import pytest
from hostile import cross_site_form_post

from primeruns.local import LocalPlatform
from primeruns.run import Run

KEY = "the-local-key-123"
BEARER = {"Authorization": f"Bearer {KEY}"}


def test_with_a_key_every_route_needs_it(
    make_local_platform: Callable[..., LocalPlatform],
) -> None:
    p = make_local_platform(api_key=KEY)
    for path in (
        "/",
        "/dashboard/evaluations/x",
        "/_dashboard/static/live.js",
        "/_local/runs",
        "/_local/runs/x",
        "/_local/faults",
        "/no/such/route",
    ):
        r = httpx.get(f"{p.url}{path}", timeout=10)
        assert r.status_code == 401, (path, r.status_code)
        assert KEY not in r.text
    # An unauthenticated fault of an hour's latency would stall every
    # authenticated call: refused, and nothing changed.
    r = httpx.post(f"{p.url}/_local/faults", json={"latency_ms": 3_600_000}, timeout=10)
    assert r.status_code == 401
    assert p.set_faults()["latency_ms"] == 0
    # The handle sends the key to its own inspection routes.
    assert p.runs() == []
    assert httpx.get(f"{p.url}/_local/runs", headers=BEARER, timeout=10).status_code == 200
    # A key sent as a cookie value is no session.
    r = httpx.get(f"{p.url}/", cookies={"primeruns_session": KEY}, timeout=10)
    assert r.status_code == 401


def test_the_dashboard_logs_in_once_by_the_link_printed_at_start(
    make_local_platform: Callable[..., LocalPlatform],
) -> None:
    p = make_local_platform(api_key=KEY)
    link = p.login_url
    assert link.startswith(f"{p.url}/?token=") and KEY not in link
    with httpx.Client(timeout=10) as browser:
        r = browser.get(link)
        assert r.status_code == 303 and r.headers["location"] == "/"
        cookie = r.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie
        assert browser.get(f"{p.url}/").status_code == 200
        assert browser.get(f"{p.url}/_dashboard/static/live.js").status_code == 200
        # The session opens pages only: the API and /_local/* want the header.
        assert browser.get(f"{p.url}/_local/runs").status_code == 401
    # The link works once; a made-up one never.
    with httpx.Client(timeout=10) as other:
        assert other.get(link).status_code == 401
        assert other.get(f"{p.url}/?token=guess").status_code == 401
        assert other.get(f"{p.url}/").status_code == 401
    # The key holder can mint another link.
    fresh = p.new_login_url()
    with httpx.Client(timeout=10) as again:
        assert again.get(fresh, follow_redirects=True).status_code == 200


def test_the_host_header_must_name_loopback(local_platform: LocalPlatform) -> None:
    url = local_platform.url
    port = url.rsplit(":", 1)[1]
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.2", "localhost.evil.example"):
        r = httpx.get(f"{url}/healthz", headers={"Host": host}, timeout=10)
        assert r.status_code == 400, (host, r.status_code)
        r = httpx.get(f"{url}/_local/runs", headers={"Host": host}, timeout=10)
        assert r.status_code == 400, (host, r.status_code)
    for host in (f"127.0.0.1:{port}", "localhost", f"LOCALHOST:{port}", "[::1]:80"):
        assert httpx.get(f"{url}/healthz", headers={"Host": host}, timeout=10).status_code == 200


def test_a_host_refused_is_not_echoed(local_platform: LocalPlatform) -> None:
    """The refusal names the server's own names, not what the client sent: a
    header value echoed is a reflection anyone who can connect chooses."""
    host = "reflected-" + "x" * 2000 + ".example"
    r = httpx.get(f"{local_platform.url}/healthz", headers={"Host": host}, timeout=10)
    assert r.status_code == 400
    assert "reflected" not in r.text
    assert "127.0.0.1" in r.json()["detail"]


def _serve(tmp_path: Path, *args: str, key: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}
    if key is not None:
        env["PRIMERUNS_LOCAL_API_KEY"] = key
    command = [sys.executable, "-m", "primeruns.local", "--port", "0", "--data", str(tmp_path)]
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, env=env, timeout=30, check=False
    )


def test_binding_beyond_loopback_without_a_key_is_refused(tmp_path: Path) -> None:
    for host in ("0.0.0.0", "::"):
        result = _serve(tmp_path / "d", "--host", host)
        assert result.returncode == 2, result.stdout + result.stderr
        assert "PRIMERUNS_LOCAL_API_KEY" in result.stderr
        assert "--allow-remote-without-key" in result.stderr
        assert "listening" not in result.stdout
    assert not (tmp_path / "d").exists()


def test_a_key_on_the_command_line_is_refused_without_echoing_it(tmp_path: Path) -> None:
    """``ps`` shows every user of the machine a server's command line for as
    long as it runs: a key given there is refused before anything listens,
    and the refusal names where a key goes instead, never the key."""
    key = "pk-on-the-command-line-0123456789"
    for args in (("--api-key", key), (f"--api-key={key}",)):
        result = _serve(tmp_path / "d", *args)
        assert result.returncode == 2, result.stdout + result.stderr
        assert "PRIMERUNS_LOCAL_API_KEY" in result.stderr
        assert key not in result.stdout + result.stderr
        assert "listening" not in result.stdout
    assert not (tmp_path / "d").exists()


#: Keys no HTTP client can send as they are: httpx refuses a non-ASCII
#: header (and a UTF-8 client's bytes never matched the server's latin-1
#: reading), h11 a line break; blanks around a header's value never arrive.
UNSENDABLE = ["clé-locale-0123456789", "pk-0123456789\n"]


@pytest.mark.parametrize(
    "key", [*UNSENDABLE, " pk-0123456789"], ids=["non-ascii", "line-break", "leading-blank"]
)
def test_a_key_no_client_can_send_is_refused_at_serve_start_without_echoing_it(
    tmp_path: Path, key: str
) -> None:
    """Served, such a key locked every client out with 401s that read as a
    wrong key: refused before anything listens, naming the variable and the
    fix, never the key."""
    result = _serve(tmp_path / "d", key=key)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "PRIMERUNS_LOCAL_API_KEY" in result.stderr and "usable as a key" in result.stderr
    assert key.strip() not in result.stdout + result.stderr
    assert "listening" not in result.stdout
    assert not (tmp_path / "d").exists()


def _online_env(monkeypatch: pytest.MonkeyPatch, platform: LocalPlatform, home: Path) -> None:
    """No key in the environment, Prime Traces on ``platform``, ``home`` for the config file."""
    monkeypatch.delenv("PRIME_API_KEY", raising=False)
    monkeypatch.setenv("PRIME_TRACES_URL", platform.url)
    monkeypatch.setenv("HOME", str(home))


def _init(platform: LocalPlatform, tmp_path: Path, key: str | None) -> Run:
    """An evaluation's ``init`` against ``platform`` with ``api_key=key``."""
    import primeruns

    return primeruns.init(
        "n",
        environments=["gsm8k"],
        model="m",
        api_key=key,
        base_url=platform.url,
        runs_dir=tmp_path / "runs",
    )


@pytest.mark.parametrize("key", UNSENDABLE, ids=["non-ascii", "line-break"])
def test_an_sdk_key_no_client_can_send_is_named_at_init_not_a_unicode_error(
    local_platform: LocalPlatform, tmp_path: Path, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``init(api_key=...)`` and the config file's key are read as
    ``PRIME_API_KEY`` is: a key httpx cannot put in a header raised a bare
    UnicodeEncodeError (or sent a broken header) from init; now a
    ConfigurationError names the setting, never the key."""
    import json

    from primeruns.exceptions import ConfigurationError

    _online_env(monkeypatch, local_platform, tmp_path)
    for given, named in ((key, "api_key"), (None, "api_key in ~/.prime/config.json")):
        config = tmp_path / ".prime" / "config.json"
        config.parent.mkdir(exist_ok=True)
        config.write_text(json.dumps({"api_key": key}))
        with pytest.raises(ConfigurationError) as raised:
            _init(local_platform, tmp_path, given)
        said = str(raised.value)
        assert said.startswith(named) and "ASCII" in said, said
        assert key.strip() not in said
    assert local_platform.runs() == []


@pytest.mark.parametrize("key", ["pk-0123456789 ", "pk-0123456789\t"], ids=["blank", "tab"])
def test_an_sdk_key_with_a_blank_around_it_ships_the_run(
    make_local_platform: Callable[..., LocalPlatform],
    tmp_path: Path,
    key: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A key pasted with a blank around it (``api_key=`` or the config file)
    is taken as the key without it, as a server reads a header: sent as
    given, h11 refused the header (a blank after it) and the run read as a
    platform never reached, its records kept for a replay that failed the
    same way."""
    local_platform = make_local_platform(api_key=key.strip())
    _online_env(monkeypatch, local_platform, tmp_path)
    run = _init(local_platform, tmp_path, key)
    run.finish()
    assert run.errors == []
    assert len(local_platform.runs()) == 1


def _listening(*args: str) -> tuple[subprocess.Popen[str], str]:
    """``serve ARGS`` as a child (reaped by the tests' autouse fixture): the
    process and the first line it printed."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}
    command = [sys.executable, "-m", "primeruns.local", "--port", "0", *args]
    proc = procs.start(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline()


def test_a_host_named_by_host_is_answered_and_others_still_not(tmp_path: Path) -> None:
    """``--host`` names another address (a loopback alias here): requests
    naming it are answered, other names still refused."""
    _, line = _listening("--host", "127.0.0.2", "--data", str(tmp_path / "d"))
    match = re.search(r"listening on (http://127\.0\.0\.2:(\d+))", line)
    assert match, line
    url, port = match.groups()
    assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
    for host in ("evil.example", f"evil.example:{port}"):
        r = httpx.get(f"{url}/healthz", headers={"Host": host}, timeout=10)
        assert r.status_code == 400, (host, r.status_code)


def test_binding_beyond_loopback_without_a_key_needs_the_explicit_flag_and_warns(
    tmp_path: Path,
) -> None:
    proc, line = _listening(
        "--host", "0.0.0.0", "--allow-remote-without-key", "--data", str(tmp_path / "d")
    )
    assert proc.stdout is not None
    said = line
    while "listening on http://" not in said:
        more = proc.stdout.readline()
        assert more, said  # it ended instead of listening
        said += more
    assert "warning: listening on 0.0.0.0 without a key" in said, said


def test_cross_site_form_posts_change_nothing(local_platform: LocalPlatform) -> None:
    url = local_platform.url
    created = httpx.post(f"{url}/api/v1/evaluations/", json={"environments": [{"id": "e"}]})
    eval_id = created.json()["evaluation_id"]
    finalize = f"{url}/api/v1/evaluations/{eval_id}/finalize"
    # An empty form post from another site (the review's finding).
    r = httpx.post(finalize, headers=cross_site_form_post(), timeout=10)
    assert r.status_code in (403, 415), r.status_code
    for content_type in (
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "text/plain",
    ):
        r = httpx.post(finalize, headers={"Content-Type": content_type}, content=b"", timeout=10)
        assert r.status_code == 415, (content_type, r.status_code)
        r = httpx.post(
            f"{url}/_local/faults",
            headers={"Content-Type": content_type},
            content=b'{"latency_ms": 1}',
            timeout=10,
        )
        assert r.status_code == 415, (content_type, r.status_code)
    # A bodiless cross-origin fetch (no Content-Type at all) still carries its Origin.
    r = httpx.post(finalize, headers={"Origin": "http://evil.example"}, timeout=10)
    assert r.status_code == 403
    assert local_platform.run(eval_id)["status"] != "COMPLETED"
    assert local_platform.set_faults()["latency_ms"] == 0
    # What the SDK sends still works: JSON, and an empty body with no Content-Type.
    assert httpx.post(finalize, timeout=10).is_success
    assert local_platform.run(eval_id)["status"] == "COMPLETED"


def test_pages_carry_csp_and_frame_headers(local_platform: LocalPlatform) -> None:
    for path in ("/", "/dashboard/evaluations/nothing", "/_dashboard/static/live.js", "/healthz"):
        r = httpx.get(f"{local_platform.url}{path}", timeout=10)
        assert "default-src 'self'" in r.headers.get("content-security-policy", ""), path
        assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
        assert r.headers.get("x-frame-options") == "DENY", path
        assert r.headers.get("x-content-type-options") == "nosniff", path


def test_the_guards_settings_never_show_the_key() -> None:
    """A repr reaches logs and tracebacks (a debugger, a ``log.debug`` of the
    server's state): the key is never in it, as ``Settings`` keeps it out."""
    from primeruns.local.guard import Guard, GuardSettings

    settings = GuardSettings(api_key=KEY)
    assert KEY not in repr(settings)
    assert KEY not in repr(vars(Guard(lambda *a: None, settings)))
