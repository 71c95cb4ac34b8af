"""Run every atheris harness in ``fuzz/`` for a fixed time and print one
results row per harness (iterations, crashes). New inputs go to a temporary
directory, so the checked-in corpus is never rewritten.

    python tools/torture/fuzz_campaign.py --seconds 600 --seed 7

``--trials`` is accepted as a synonym of ``--seconds`` per harness, for
symmetry with the other torture commands. Exits 1 if any harness crashed;
the crashing input is kept under the printed work directory.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HARNESSES = ("settings_parsing", "upload_parser", "fuzz_frames", "fuzz_open", "encode_record")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", "--trials", type=int, default=60, dest="seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", nargs="*", default=list(HARNESSES), help="harness names")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fuzz-campaign-"))
    failed = 0
    for name in args.only:
        script = ROOT / "fuzz" / f"{name}.py"
        if not script.exists():
            continue
        new = work / name
        new.mkdir()
        corpus = ROOT / "fuzz" / "corpus" / name
        result = subprocess.run(
            [
                sys.executable,
                str(script),
                str(new),
                *([str(corpus)] if corpus.is_dir() else []),
                f"-max_total_time={args.seconds}",
                "-rss_limit_mb=4096",
                f"-seed={args.seed}",
                f"-artifact_prefix={new}/",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        done = re.search(r"Done (\d+) runs", result.stderr)
        runs = int(done.group(1)) if done else 0
        crashed = result.returncode != 0
        failed += crashed
        print(
            f"| fuzz {name} | {runs} iterations in {args.seconds} s (seed {args.seed}) "
            f"| crashes {int(crashed)} |",
            flush=True,
        )
        if crashed:
            print(result.stderr[-3000:], file=sys.stderr)
    print(f"work directory: {work}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
