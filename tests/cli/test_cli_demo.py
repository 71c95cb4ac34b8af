"""``primeruns demo`` (the README's main command) passes end to end."""

from __future__ import annotations

import json
import os
from pathlib import Path

from cli_helpers import cli_subprocess


def test_demo_passes_every_check_and_says_where_to_look(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIME")}
    env["HOME"] = str(tmp_path / "home")
    report = tmp_path / "report.json"
    done = cli_subprocess(
        "demo", "--dir", str(tmp_path / "demo"), "--json-report", str(report), env=env
    )
    assert done.returncode == 0, done.stdout + done.stderr
    checks = json.loads(report.read_text())
    assert checks and all(c["ok"] for c in checks)
    assert any("FAILED with a crash reason" in c["what"] for c in checks)
    assert f"primeruns ls --runs-dir {tmp_path / 'demo' / 'runs'}" in done.stdout
    assert "demo-" not in done.stdout.replace("demo-gsm8k", "").replace("demo-train", "")
    listed = cli_subprocess("ls", "--runs-dir", str(tmp_path / "demo" / "runs"), "--json", env=env)
    assert sorted(r["state"] for r in json.loads(listed.stdout)) == ["shipped"] * 3
