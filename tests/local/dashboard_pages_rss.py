"""Render offline dashboard pages in this process and report its peak RSS.

Run as a child (``python dashboard_pages_rss.py RUNS_DIR PATH...``) so that
the peak is the dashboard's alone: prints one JSON line with each page's
status, size and seconds, and ``maxrss_mb``. The memory bound of
``test_security_hostile_journals`` and ``tools/bench/dashboard_memory.py``
read it.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path


def main() -> int:
    from starlette.testclient import TestClient

    from primeruns.local.dashboard.routes import offline_app

    runs_dir, paths = Path(sys.argv[1]), sys.argv[2:]
    pages = []
    with TestClient(offline_app(runs_dir)) as client:
        for path in paths:
            start = time.perf_counter()
            answer = client.get(path)
            pages.append(
                {
                    "path": path,
                    "status": answer.status_code,
                    "bytes": len(answer.content),
                    "seconds": round(time.perf_counter() - start, 3),
                    "clipped": "clipped" in answer.text,
                }
            )
    maxrss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"pages": pages, "maxrss_mb": round(maxrss_mb, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
