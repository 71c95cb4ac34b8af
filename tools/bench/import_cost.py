"""What ``import primeruns`` costs, and what the CLI's dependencies add to it.

Each variant imports primeruns in a fresh child, with some modules made
unimportable by a meta-path finder (as if not installed), interleaved over
rounds so that the machine's load falls on every variant alike. The variants:
everything installed; rich blocked (as before the CLI used it); click blocked
(a bare ``pip install prime-runs``, which has no click, so httpx does not
import its own command line, and with it rich).

    python tools/bench/import_cost.py [--rounds 12]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

_CHILD = """
import importlib.abc, sys, time
blocked = set(sys.argv[1].split(",")) - {""}

class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Blocked())
start = time.perf_counter()
import primeruns
print((time.perf_counter() - start) * 1000, "rich" in sys.modules)
"""

VARIANTS = {"everything installed": "", "rich blocked": "rich", "click blocked": "click"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    loads_rich: dict[str, bool] = {}
    for _ in range(args.rounds):
        for name, blocked in VARIANTS.items():
            out = subprocess.run(
                [sys.executable, "-c", _CHILD, blocked],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            times[name].append(float(out[0]))
            loads_rich[name] = out[1] == "True"
    print(f"import primeruns, median of {args.rounds} interleaved rounds:")
    for name, values in times.items():
        rich = "loads rich" if loads_rich[name] else "no rich"
        print(f"  {name:<22} {statistics.median(values):7.1f} ms  ({rich})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
