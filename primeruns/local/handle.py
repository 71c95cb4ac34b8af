"""``LocalPlatform``: the local platform as a real child process, for tests and demos.

A real process (not an in-process app) so that what callers exercise is what
users get: a loopback socket, SIGTERM, a restart on the same data, and
"platform down" as a refused connection. The API key reaches the child through
its environment, never its command line. The child's output goes to
``<data>/server.log`` (0600), which is where to look when a start fails.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn

import httpx

from .cli import API_KEY_ENV
from .storage import ensure_private_dir

_LISTENING = re.compile(rb"primeruns serve: listening on (http://\S+)")
_LOGIN = re.compile(rb"primeruns serve: dashboard login \(once\): (http://\S+)")
# A bound on a hang, not a speed target: it starts in ~1 s, but on a shared
# 2-core machine under load its imports alone have taken over 20 s.
START_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0
# The longest single wait of ``wait()``: a signal flagged on its way into a
# wait is handled at the end of that slice.
_WAIT_SLICE_S = 1.0


class LocalPlatform:
    """Runs ``python -m primeruns.local`` (= ``primeruns serve``) in a subprocess.

    ``url`` is the origin (``http://127.0.0.1:PORT``); it stays the same across
    ``stop()``/``start()`` because the first port picked is reused. Not
    thread-safe: drive one instance from one thread.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        api_key: str | None = None,
        port: int = 0,
        traces_disabled: bool = False,
        train_teams: Sequence[str] | None = None,
        retryable_rate: float = 0.0,
        ambiguous_rate: float = 0.0,
        latency_ms: int = 0,
        fault_seed: int = 0,
        head_timeout: float | None = None,
        body_timeout: float | None = None,
        max_connections: int | None = None,
        body_memory: int | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self._api_key = api_key
        self._port = port
        self._flags: list[str] = []
        if traces_disabled:
            self._flags.append("--traces-disabled")
        if train_teams is not None:
            self._flags += ["--train-teams", ",".join(train_teams)]
        self._flags += [
            "--retryable-rate",
            str(retryable_rate),
            "--ambiguous-rate",
            str(ambiguous_rate),
            "--latency-ms",
            str(latency_ms),
            "--fault-seed",
            str(fault_seed),
        ]
        # Connection limits (``serve``'s defaults unless given: short ones let
        # a test meet them).
        for flag, value in (
            ("--head-timeout", head_timeout),
            ("--body-timeout", body_timeout),
            ("--max-connections", max_connections),
            ("--body-memory", body_memory),
        ):
            if value is not None:
                self._flags += [flag, str(value)]
        self._proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        #: With a key: the one-time dashboard login link the server printed.
        self.login_url = ""

    @property
    def log_path(self) -> Path:
        return self.data_dir / "server.log"

    @property
    def pid(self) -> int:
        """The server process's id (for a test's look at its memory)."""
        assert self._proc is not None, "not started"
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        """The exit code of the last stopped process (None while running)."""
        return None if self._proc is None else self._proc.poll()

    def start(self) -> LocalPlatform:
        """Start the server; returns once ``/healthz`` answers 200.

        Raises RuntimeError (with the log's tail) if it exits or does not get
        ready within ``START_TIMEOUT`` s.
        """
        if self._proc is not None and self._proc.poll() is None:
            return self
        ensure_private_dir(self.data_dir)
        env = dict(os.environ)
        env.pop(API_KEY_ENV, None)
        if self._api_key is not None:
            env[API_KEY_ENV] = self._api_key
        cmd = [
            sys.executable,
            "-m",
            "primeruns.local",
            "--host",
            "127.0.0.1",
            "--port",
            str(self._port),
            "--data",
            str(self.data_dir),
            *self._flags,
        ]
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as log:
            self._proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
        deadline = time.monotonic() + START_TIMEOUT
        try:
            self.url = self._wait_for_url(deadline)
            self._port = int(self.url.rsplit(":", 1)[1])
            self._wait_healthy(deadline)
            if self._api_key is not None:
                self.login_url = self._login_link()
        except BaseException:
            self.stop()  # a signal or Ctrl-C while it starts: never leave it running
            raise
        return self

    def _wait_for_url(self, deadline: float) -> str:
        while time.monotonic() < deadline:
            match = _LISTENING.search(self.log_path.read_bytes())
            if match:
                return match.group(1).decode()
            self._check_alive()
            time.sleep(0.02)
        self._fail("did not report its address in time")

    def _login_link(self) -> str:
        # Printed right after the address, before /healthz could answer.
        match = _LOGIN.search(self.log_path.read_bytes())
        if match is None:
            self._fail("did not print its dashboard login link")
        return match.group(1).decode()

    def _wait_healthy(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            self._check_alive()
            time.sleep(0.02)
        self._fail("did not become healthy in time")

    def _check_alive(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            self._fail(f"exited with code {self._proc.returncode}")

    def _fail(self, what: str) -> NoReturn:
        tail = self.log_path.read_text(errors="replace")[-2000:]
        self.stop()
        raise RuntimeError(f"local platform {what}; log tail:\n{tail}")

    def wait(self) -> int | None:
        """Until the server exits (a signal handler's exception interrupts it).

        Waited in slices of a second: CPython runs a signal's handler at the
        main thread's next check, and a signal landing on a wait's way in
        (after that check, before the system call) is handled when the wait
        ends. Waited whole, a Ctrl-C or SIGTERM landing so was never handled.
        """
        if self._proc is None:
            return None
        while True:
            try:
                return self._proc.wait(timeout=_WAIT_SLICE_S)
            except subprocess.TimeoutExpired:
                continue

    def stop(self) -> None:
        """SIGTERM the server and wait for it (SIGKILL after 10 s)."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> LocalPlatform:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def auth_headers(self) -> dict[str, str]:
        """The header every route wants when the server has a key (else none)."""
        return {} if self._api_key is None else {"Authorization": f"Bearer {self._api_key}"}

    def new_login_url(self) -> str:
        """Another one-time dashboard login link (the key holder may mint them)."""
        url: str = self._request("POST", "/_local/login")["url"]
        return url

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        headers = {**self.auth_headers, **kwargs.pop("headers", {})}
        response = httpx.request(
            method, f"{self.url}{path}", timeout=10.0, headers=headers, **kwargs
        )
        response.raise_for_status()
        return response.json()

    def set_faults(
        self,
        *,
        retryable_rate: float | None = None,
        ambiguous_rate: float | None = None,
        latency_ms: int | None = None,
        seed: int | None = None,
        retry_after: float | None = None,
        slowloris_rate: float | None = None,
        slowloris_interval_s: float | None = None,
        statuses: Sequence[int] | None = None,
        routes: Sequence[str] | None = None,
        bogus_rate: float | None = None,
        bogus_bodies: Sequence[str] | None = None,
        bogus_processed: float | None = None,
        max_body_bytes: int | None = None,
        max_faults: int | None = None,
    ) -> dict[str, Any]:
        """Change fault injection at runtime; returns the settings now in force
        (plus ``injected``: how many faults were drawn so far)."""
        changes: dict[str, Any] = {
            "statuses": None if statuses is None else list(statuses),
            "routes": None if routes is None else list(routes),
            "bogus_bodies": None if bogus_bodies is None else list(bogus_bodies),
            "bogus_rate": bogus_rate,
            "bogus_processed": bogus_processed,
            "max_body_bytes": max_body_bytes,
            "max_faults": max_faults,
            "retryable_rate": retryable_rate,
            "ambiguous_rate": ambiguous_rate,
            "latency_ms": latency_ms,
            "seed": seed,
            "retry_after": retry_after,
            "slowloris_rate": slowloris_rate,
            "slowloris_interval_s": slowloris_interval_s,
        }
        body = {k: v for k, v in changes.items() if v is not None}
        result: dict[str, Any] = self._request("POST", "/_local/faults", json=body)
        return result

    def run(self, run_id: str) -> dict[str, Any]:
        """What the server stored for ``run_id`` (``GET /_local/runs/{run_id}``)."""
        result: dict[str, Any] = self._request("GET", f"/_local/runs/{run_id}")
        return result

    def runs(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._request("GET", "/_local/runs")["runs"]
        return result
