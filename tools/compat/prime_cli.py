"""The `prime` CLI 0.18.0's read commands against `primeruns serve`.

``python tools/compat/prime_cli.py`` builds a virtual environment of its own
(``tools/compat/.prime-cli``, reused by later runs) with the vendor's `prime`
CLI from PyPI, starts the local platform on a temporary data directory, logs
one training run and one evaluation with this SDK, then runs every `prime
train` read command (list, get, metrics, rollouts, progress, distributions,
logs, checkpoints, components) and `prime eval list / get / samples` against
it. Each command must exit 0 and its output must hold what the SDK logged (the
run's id, its step numbers, its sample count). Exit 1 on the first failure,
with the command and its output. CI runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import venv
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WORK = HERE / ".prime-cli"
VERSION = "0.18.0"
KEY = "prime-cli-compat-key"

sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import workloads  # noqa: E402  (the bundled workloads, in the repository's tests/)

import primeruns as pr  # noqa: E402
from primeruns.local import LocalPlatform  # noqa: E402


def prime_cli() -> Path:
    python = WORK / "venv" / "bin" / "python"
    if not (WORK / "venv" / "bin" / "prime").exists():
        venv.create(WORK / "venv", with_pip=True, clear=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"prime=={VERSION}"],
                       check=True)  # fmt: skip
    return WORK / "venv" / "bin" / "prime"


def log_runs(url: str, runs_dir: Path) -> tuple[str, str]:
    """One training run (30 steps, samples every 10th) and one evaluation."""
    settings: dict[str, Any] = {"api_key": KEY, "base_url": url, "runs_dir": runs_dir}
    train = pr.init(kind="train", model="Qwen/Qwen3-8B", environments=["swe-lite"],
                    team_id="team-a", training=pr.TrainingSpec(max_steps=30, batch_size=4),
                    **settings)  # fmt: skip
    for step, episodes in workloads.agentic_by_step(4).items():
        train.log_episodes(episodes)
        train.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
    train.finish(timeout=120)
    evaluation = pr.init(kind="eval", model="gpt-4.1-mini", environments=["gsm8k"], **settings)
    evaluation.log_episodes(workloads.gsm8k(20))
    evaluation.finish(timeout=120)
    assert train.id and evaluation.id
    return train.id, evaluation.id


def main() -> int:
    prime = prime_cli()
    with tempfile.TemporaryDirectory(prefix="prime-cli-compat-") as tmp:
        work = Path(tmp)
        (work / "home").mkdir()
        platform = LocalPlatform(work / "platform").start()
        try:
            os.environ["HOME"] = str(work / "home")
            os.environ["PRIME_TRACES_URL"] = platform.url  # Prime Traces is served there too
            train_id, eval_id = log_runs(platform.url, work / "runs")
            env = {
                "PATH": os.environ.get("PATH", ""),
                "HOME": str(work / "home"),
                "PRIME_API_KEY": KEY,
                "PRIME_API_BASE_URL": platform.url,
                "NO_COLOR": "1",
                "COLUMNS": "200",
            }
            failures = 0
            for args, check in checks(train_id, eval_id):
                done = subprocess.run([str(prime), *args], env=env, capture_output=True,
                                      text=True, timeout=120, check=False)  # fmt: skip
                ok = done.returncode == 0 and check(done.stdout)
                print(f"{'ok  ' if ok else 'FAIL'} prime {' '.join(args)}", flush=True)
                if not ok:
                    failures += 1
                    print(f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        finally:
            platform.stop()
    return 1 if failures else 0


def _json(text: str) -> Any:
    return json.loads(text[text.index("{") :])


def checks(train: str, evaluation: str) -> list[tuple[list[str], Callable[[str], bool]]]:
    return [
        (["train", "list"], lambda out: train[:8] in out),
        (["train", "list", "-o", "json"],
         lambda out: any(r["id"] == train for r in _json(out)["runs"])),
        (["train", "get", train], lambda out: train in out and "COMPLETED" in out),
        (["train", "metrics", train], lambda out: len(_json(out)["metrics"]) == 30),
        (["train", "rollouts", train, "--step", "10"],
         lambda out: _json(out)["total"] == 4 and len(_json(out)["samples"]) == 4),
        (["train", "progress", train],
         lambda out: _json(out)["steps_with_samples"] == [0, 10, 20]
         and _json(out)["latest_step"] == 29),
        (["train", "distributions", train, "--step", "20"],
         lambda out: sum(b["count"] for b in _json(out)["bins"]) == 4),
        (["train", "logs", train], lambda out: True),  # an external run has no logs
        (["train", "checkpoints", train], lambda out: "No checkpoints" in out),
        (["train", "components", train], lambda out: True),
        (["eval", "list"], lambda out: evaluation[:8] in out),
        (["eval", "get", evaluation], lambda out: evaluation in out),
        (["eval", "samples", evaluation], lambda out: "20" in out or "sample" in out.lower()),
    ]  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
