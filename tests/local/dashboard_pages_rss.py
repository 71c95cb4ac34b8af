"""Render offline dashboard pages in this process and report its peak RSS.

Run as a child (``python dashboard_pages_rss.py RUNS_DIR PATH...``) so that
the peak is the dashboard's alone: prints one JSON line with each page's
status, size and seconds, and ``maxrss_mb``. The memory bound of
``test_security_hostile_journals`` and ``tools/bench/dashboard_memory.py``
read it.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
from pathlib import Path


def peak_rss_mb() -> float:
    """This process's peak RSS. ``VmHWM`` is its memory's own high-water mark;
    ``ru_maxrss`` is not used where VmHWM exists, since Linux carries it over
    from the parent through fork and exec (a test that wrote a large journal
    first would be measured with its own peak)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def _pages(runs_dir: Path, paths: list[str]) -> list[dict[str, object]]:
    import httpx

    from primeruns.local.dashboard.routes import offline_app

    pages: list[dict[str, object]] = []
    transport = httpx.ASGITransport(app=offline_app(runs_dir))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        for path in paths:
            start = time.perf_counter()
            answer = await client.get(path, timeout=600)
            pages.append(
                {
                    "path": path,
                    "status": answer.status_code,
                    "bytes": len(answer.content),
                    "seconds": round(time.perf_counter() - start, 3),
                    "clipped": "clipped" in answer.text,
                }
            )
    return pages


def main() -> int:
    pages = asyncio.run(_pages(Path(sys.argv[1]), sys.argv[2:]))
    print(json.dumps({"pages": pages, "maxrss_mb": round(peak_rss_mb(), 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
