"""Testing code that logs runs: the local platform as a pytest fixture, and a
seam for an in-process ``httpx`` transport.

A user's pipeline calls ``pr.init()`` and ``run.log_*()`` and knows nothing of
tests. ``prime_platform`` starts the local platform (:class:`LocalPlatform`, a
child process on a temporary data dir) only in a test that asks for it, points
the SDK at it through the environment (with ``HOME`` and every ``PRIME_*``
variable of the machine kept out, so a real key never registers a test run),
and hands the test a :class:`PrimePlatform` to read back what landed.
:func:`use_transport` is for a test that prefers to answer the platform itself
(an ``httpx.MockTransport``): the run then ships from threads of the test's
process, through that transport.

Not registered as an automatic pytest plugin: importing the SDK costs about
half a second, which every pytest run of every project in the environment
would pay. A project opts in from its ``conftest.py``
(``pytest_plugins = ["primeruns.testing"]``, or
``from primeruns.testing import prime_platform``). Nothing heavy is imported
until a fixture is used.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

if TYPE_CHECKING:
    from .local import LocalPlatform

__all__ = ["PrimePlatform", "prime_platform", "use_transport"]

#: The key the fixture's SDK sends (the local platform accepts any).
TEST_API_KEY = "prime-runs-test-key"


class PrimePlatform:
    """A started local platform the SDK is pointed at, and what it stored.

    ``url`` is its origin, ``runs_dir`` the runs directory the SDK journals
    in, ``local`` the :class:`LocalPlatform` itself (``set_faults``,
    ``restart``, ``stop``). Every read goes through the platform's HTTP API,
    as the vendor's clients read it.
    """

    def __init__(self, local: LocalPlatform, runs_dir: Path) -> None:
        self.local = local
        self.url = local.url
        self.runs_dir = runs_dir

    def _get(self, path: str, **params: Any) -> Any:
        answer = httpx.get(
            f"{self.url}{path}",
            params=params,
            headers={"Authorization": f"Bearer {TEST_API_KEY}"},
            timeout=30.0,
        )
        answer.raise_for_status()
        return answer.json()

    def runs(self) -> list[dict[str, Any]]:
        """Every run stored, oldest first: ``id``, ``name``, ``kind``, ``status``."""
        return self.local.runs()

    def run(self, run_id: str) -> dict[str, Any]:
        """What was stored for ``run_id``: ``status``, ``error_message``,
        ``summary``, ``config`` and counts of stored rows beside distinct ids
        (``samples``, ``traces``, ``train_metrics``), so that a record stored
        twice shows as ``rows > distinct``."""
        return self.local.run(run_id)

    def episodes(self, run_id: str) -> list[dict[str, Any]]:
        """The episode records Prime Traces stored for ``run_id`` with their
        traces, as uploaded (``run.id`` is the platform's id), oldest first (by
        their first trace's start)."""
        ids: list[str] = []
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {"run_id": run_id, "limit": 100}
            if cursor is not None:
                params["cursor"] = cursor
            page = self._get("/api/v1/episodes", **params)
            ids += [item["episode_id"] for item in page["items"]]
            cursor = page.get("next_cursor")
            if cursor is None:
                break
        # Listed newest first; read back in the order they were stored. The
        # service keeps an episode's traces apart and names them in its record.
        episodes = []
        for episode_id in reversed(ids):
            episode = self._get(f"/api/v1/episodes/{episode_id}", raw="true")
            episode["traces"] = [
                self._get(f"/api/v1/traces/{trace_id}", raw="true")
                for trace_id in episode.get("traces") or []
            ]
            episodes.append(episode)
        return episodes

    def samples(self, run_id: str) -> list[dict[str, Any]]:
        """An evaluation's sample table (one row per episode), in stored order."""
        rows: list[dict[str, Any]] = []
        page = 1
        while True:
            answer = self._get(f"/api/v1/evaluations/{run_id}/samples", page=page, limit=1000)
            rows += answer["samples"]
            if not answer["samples"] or len(rows) >= answer["total"]:
                return rows
            page += 1

    def metrics(self, run_id: str) -> list[dict[str, Any]]:
        """A training run's metric rows, by step (as ``log_metrics`` sent them)."""
        rows: list[dict[str, Any]] = self._get(f"/api/v1/rft/runs/{run_id}/metrics")["metrics"]
        return rows


def _isolate(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    """Keep this machine's settings out of a test: ``HOME`` (and with it
    ``~/.prime/config.json``) moves to ``home`` and no ``PRIME_*`` variable
    the SDK reads is left (``XDG_STATE_HOME`` neither: sync journals live
    under it)."""
    from .settings import VARIABLES

    home.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("HOME", str(home))
    for name in (*VARIABLES, "XDG_STATE_HOME"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def prime_platform(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[PrimePlatform]:
    """The local platform, started for this test and stopped after it, with the
    SDK pointed at it: ``pr.init()`` in the code under test registers and ships
    there, unchanged, through the uplink as in production."""
    from .local import LocalPlatform

    root = tmp_path_factory.mktemp("prime-platform")
    _isolate(monkeypatch, root / "home")
    with LocalPlatform(root / "data") as local:
        runs_dir = root / "runs"
        monkeypatch.setenv("PRIME_API_KEY", TEST_API_KEY)
        monkeypatch.setenv("PRIME_API_BASE_URL", local.url)
        monkeypatch.setenv("PRIME_TRACES_URL", local.url)
        monkeypatch.setenv("PRIME_RUNS_DIR", str(runs_dir))
        # A short back-off, so that a test rehearsing faults (local.set_faults)
        # retries quickly; the policy is the same.
        monkeypatch.setenv("PRIME_RUNS_RETRY_BASE_S", "0.02")
        yield PrimePlatform(local, runs_dir)


@contextmanager
def use_transport(transport: httpx.BaseTransport) -> Iterator[None]:
    """Every request a run of this process makes goes to ``transport`` (an
    ``httpx.MockTransport``, say) while the block runs: registration, every
    upload and the close-out, which then ship from threads of this process
    (``PRIME_RUNS_UPLINK=threads``) instead of the uplink process a mock
    cannot reach. The transport answers the platform's protocol
    (docs/TESTING.md says what a run sends)."""
    from .platform import client
    from .settings import uplink_overridden

    previous_transport = client.default_transport
    client.default_transport = transport
    try:
        with uplink_overridden("threads"):
            yield
    finally:
        client.default_transport = previous_transport
