"""Write a hostile journal (tiny on disk, huge once decoded) for a manual look.

    python tools/security/hostile_journal.py RUNS_DIR
    primeruns serve --runs-dir RUNS_DIR     # then open the dashboard

What it holds is described in ``tests/local/hostile_journal.py``; the test
``tests/local/test_security_hostile_journals.py`` holds the dashboard to a
memory bound over it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "local"))

from hostile_journal import write_hostile_journal


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs_dir", type=Path)
    parser.add_argument("--id", default="hostile", help="the journal's folder name")
    parser.add_argument("--kind", choices=("eval", "train"), default="eval", help="the run's kind")
    args = parser.parse_args()
    path = write_hostile_journal(args.runs_dir, args.id, args.kind)
    size = sum(p.stat().st_size for p in path.iterdir() if p.is_file())
    print(f"wrote {path} ({size // 1024} KB on disk)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
