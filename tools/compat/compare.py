"""This SDK against the vendor's, line by line: the public API probe, under both interpreters.

``python tools/compat/compare.py`` starts one local platform (training
allowed for every team but ``team-outside``), runs ``probe.py`` with this
project's interpreter and with the vendor's (``prime-runs`` 0.1.4 and
``prime-traces`` 0.0.10 in a virtual environment of their own,
``tools/bench/.venv-vendor``, created on first use: the vendor's package owns
the ``prime_runs`` import name this project provides), and compares the
answers. A line that differs must be listed in ``differences.txt`` with its
reason; exit 1 names any other, and any listed one that no longer differs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "bench"))

from end_to_end import vendor_python  # noqa: E402

from primeruns.local import LocalPlatform  # noqa: E402


def answers(python: str, url: str, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PRIME_", "PRIMERUNS_"))}
    env["HOME"] = str(home)  # no ~/.prime/config.json of the developer's
    proc = subprocess.run(
        [python, "-P", str(HERE / "probe.py"), url],
        capture_output=True,
        text=True,
        env=env,
        cwd=home,
        timeout=300,
    )
    if proc.returncode != 0:
        raise SystemExit(f"the probe failed under {python}:\n{proc.stderr[-3000:]}")
    out: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        label, _, answer = line.partition(" => ")
        if label in out:
            raise SystemExit(f"the probe asks {label!r} twice: labels must be unique")
        out[label] = answer
    return out


def documented() -> dict[str, str]:
    listed: dict[str, str] = {}
    for line in (HERE / "differences.txt").read_text().splitlines():
        # "suite:" lines are the vendor's test scenarios (tests/test_vendor_scenarios.py).
        if line.strip() and not line.startswith(("#", "suite: ")):
            label, _, reason = line.partition(" | ")
            listed[label.strip()] = reason.strip()
    return listed


def main() -> int:
    vendor = str(vendor_python())
    with tempfile.TemporaryDirectory(prefix="primeruns-compat-") as scratch:
        root = Path(scratch)
        (root / "home").mkdir()
        server = LocalPlatform(root / "platform", train_teams=["team-a", "team-b"])
        server.start()
        try:
            theirs = answers(vendor, server.url, root / "home")
            ours = answers(sys.executable, server.url, root / "home")
        finally:
            server.stop()
    listed = documented()
    unexpected, stale = [], []
    for label in sorted(set(theirs) | set(ours)):
        a, b = theirs.get(label, "(no answer)"), ours.get(label, "(no answer)")
        if a == b:
            if label in listed:
                stale.append(label)
            print(f"same  {label}: {a}")
        elif label in listed:
            print(f"known {label}:\n        vendor: {a}\n        ours:   {b}")
            print(f"        why: {listed[label]}")
        else:
            unexpected.append(label)
            print(f"DIFF  {label}:\n        vendor: {a}\n        ours:   {b}")
    print(f"{len(theirs)} probes; {len(unexpected)} unexpected difference(s); {len(stale)} stale")
    for label in stale:
        print(f"differences.txt lists {label!r}, which no longer differs: remove it")
    return 1 if unexpected or stale else 0


if __name__ == "__main__":
    sys.exit(main())
