"""finish() of a run whose platform is unreachable from init() on.

#26 and #30 ask that, with a key and no route, ``finish()`` return within the
stall bound (``PRIME_RUNS_STALL_S=5``: within ~15 s; the vendor's SDK takes
59 s) and say how to ship the run later. This times it in both uplink modes,
against a port nothing listens on, in a fresh HOME.

    python tools/bench/unreachable_finish.py [--stall 5] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = """
import time, primeruns as pr
run = pr.init(environments=["gsm8k"], api_key="k", base_url="http://127.0.0.1:9")
for i in range(5):
    run.log_episodes([{"id": f"e{i}", "run": {}, "traces": []}])
t = time.monotonic()
run.finish()
print(time.monotonic() - t)
"""


def finish_seconds(mode: str, stall: float) -> float:
    with tempfile.TemporaryDirectory(prefix="unreachable-finish-") as home:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PRIME")}
        env.update(HOME=home, PRIME_RUNS_STALL_S=str(stall), PRIME_RUNS_UPLINK=mode,
                   PRIME_TRACES_URL="http://127.0.0.1:9")  # fmt: skip
        done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                              text=True, timeout=600, check=True)  # fmt: skip
        return float(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stall", type=float, default=5.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"| uplink | finish() s, median of {args.repeat} | budget (3 x stall) |")
    print("|---|---|---|")
    for mode in ("process", "threads"):
        t0 = time.monotonic()
        times = [finish_seconds(mode, args.stall) for _ in range(args.repeat)]
        median = statistics.median(times)
        verdict = "ok" if median <= 3 * args.stall else "MISS"
        print(f"| {mode} | {median:.1f} ({time.monotonic() - t0:.0f} s) | {verdict} |")


if __name__ == "__main__":
    main()
