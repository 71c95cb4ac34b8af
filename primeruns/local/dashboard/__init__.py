"""The dashboard: runs, curves, samples and episodes as pages in the browser.

The same pages are served from two places: the local platform (its SQLite
database, at the real platform's ``/dashboard/...`` paths, so ``run.url``
opens them) and a directory of run journals (``primeruns serve --runs-dir``),
read-only, for offline runs before they are synced. What differs is only the
:class:`~.views.Source` the routes read from.
"""

from __future__ import annotations

from .routes import dashboard_routes, offline_app

__all__ = ["dashboard_routes", "offline_app"]
