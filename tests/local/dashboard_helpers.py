"""What the dashboard tests share: hostile content, runs made through the SDK,
and reading the local platform's own API for the figures a page must show."""

from __future__ import annotations

import asyncio
import copy
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import procs

import primeruns as pr
from primeruns.commands.demo_data import eval_episodes, train_episodes

#: User content that would run if a page put it in as markup.
HOSTILE = "<script>window.__pwned = 1</script><img src=x onerror='window.__pwned = 2'>"


def fresh(episode: dict[str, Any]) -> dict[str, Any]:
    """A copy of a demo episode under new ids (episodes are stored once per id)."""
    copied = copy.deepcopy(episode)
    copied["id"] = uuid.uuid4().hex
    for trace in copied.get("traces") or []:
        trace["id"] = uuid.uuid4().hex
    return copied


def hostile_episode() -> dict[str, Any]:
    """A demo eval episode whose prompt and answer are markup."""
    episode = fresh(eval_episodes()[0])
    for node in episode["traces"][0]["nodes"]:
        node["message"]["content"] = f"{node['message']['role']} says {HOSTILE}"
    return episode


#: Errors put in the demo's episodes: sample index -> (where, type, message).
ERRORS = {
    3: ("trace", "ToolTimeout", "tool hung after 30 s"),
    7: ("trace", "ToolTimeout", "tool hung after 60 s"),
    9: ("trace", "ParseError", "no \\boxed{} answer"),
    12: ("episode", "SandboxError", "the sandbox did not start"),
}


def errored_episodes() -> list[dict[str, Any]]:
    """The demo's 30 gsm8k episodes, four with errors (``ERRORS``): two tool
    timeouts and a parse error in their trace, a sandbox error in the episode's
    own list."""
    episodes = [fresh(e) for e in eval_episodes()]
    for index, (where, kind, message) in ERRORS.items():
        error = {"type": kind, "message": message, "status_code": None}
        holder = episodes[index]["traces"][0] if where == "trace" else episodes[index]
        holder["errors"] = [error]
    return episodes


def offline_eval(runs: Path, n: int, name: str = "offline-eval") -> pr.Run:
    run = pr.init(name=name, environments=["gsm8k"], model="m", mode="offline", runs_dir=runs)
    demo = eval_episodes()
    run.log_episodes([fresh(demo[i % len(demo)]) for i in range(n)])
    run.finish(summary={"avg_reward": 0.5})
    return run


def offline_train(runs: Path, steps: int, name: str = "offline-train") -> pr.Run:
    run = pr.init(
        name=name,
        kind="train",
        model="m",
        team_id="team-a",
        mode="offline",
        runs_dir=runs,
        training=pr.TrainingSpec(max_steps=steps * 2),
    )
    demo_steps = train_episodes()
    for step in range(steps):
        episodes = [fresh(e) for e in demo_steps[step % len(demo_steps)]]
        for episode in episodes:
            episode["run"]["work"]["step"] = step  # the demo's episodes say their own step
        run.log_episodes(episodes)
        run.log_metrics({"loss": 1.0 / (step + 1), "reward": step / steps}, step=step)
    run.finish()
    return run


def stored_metrics(url: str, key: str, run_id: str) -> list[dict[str, Any]]:
    """The training run's metric rows, as the platform's own API returns them."""
    answer = httpx.get(
        f"{url}/api/v1/rft/runs/{run_id}/metrics",
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    )
    answer.raise_for_status()
    rows: list[dict[str, Any]] = answer.json()["metrics"]
    return rows


def stored_steps(url: str, key: str, run_id: str) -> list[int]:
    """The steps the platform stored metrics for."""
    return sorted(int(m["step"]) for m in stored_metrics(url, key, run_id))


def stored_samples(url: str, key: str, run_id: str) -> list[dict[str, Any]]:
    """The evaluation's sample rows as the platform's API returns them (first 1000)."""
    answer = httpx.get(
        f"{url}/api/v1/evaluations/{run_id}/samples",
        params={"page": 1, "limit": 1000},
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    )
    answer.raise_for_status()
    samples: list[dict[str, Any]] = answer.json()["samples"]
    return samples


def local_runs(url: str, key: str | None = None) -> dict[str, dict[str, Any]]:
    """Every run the platform knows, by name (``key``: the platform's, if it has one)."""
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    answer = httpx.get(f"{url}/_local/runs", headers=headers, timeout=10)
    answer.raise_for_status()
    return {r["name"]: r for r in answer.json()["runs"]}


def serve_runs_dir(runs: Path) -> tuple[subprocess.Popen[str], str]:
    """``primeruns serve --runs-dir RUNS`` as a child (reaped by the tests'
    autouse fixture): the process and its origin, once it listens."""
    proc = procs.start(
        [sys.executable, "-m", "primeruns.local", "--runs-dir", str(runs), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the first line says where it listens, or why it stopped
    match = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
    assert match, line + proc.stdout.read()
    return proc, match.group(1)


class OfflinePages:
    """The offline dashboard (``serve --runs-dir``'s app) asked in this process,
    with no server: ``get(path)`` answers as the served pages would."""

    def __init__(self, runs: Path) -> None:
        from primeruns.local.dashboard import offline_app

        self.app = offline_app(runs)

    def __enter__(self) -> OfflinePages:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def get(self, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
        async def fetch() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
                return await c.get(path, headers=headers, timeout=60)

        return asyncio.run(fetch())
