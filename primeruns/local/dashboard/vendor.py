"""The charting script the curves are drawn with, served from its installed package.

The dashboard draws with uPlot (chosen by ``tools/bench/chart_choice.py``).
It is not copied into this repository and not fetched from a CDN: the
``youplot`` wheel, a dependency of the ``local`` extra, ships uPlot's own
``dist`` files (1.6.31, byte for byte the npm package's), and this module
serves those two files at ``/_dashboard/vendor/``. Nothing of ``youplot`` is
imported: its package folder is found by its import spec alone. Without it,
the route answers 503 naming the install, and the curves say their script
did not load (the captions still give each metric's last value).
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse, Response
from starlette.routing import Route

#: The package that ships the script, and the files served from it, by name.
PACKAGE = "youplot"
FILES = {
    "uplot.js": ("vendor/uplot.iife.min.js", "text/javascript; charset=utf-8"),
    "uplot.css": ("vendor/uplot.min.css", "text/css; charset=utf-8"),
}
INSTALL = "pip install 'prime-runs[local]'"


@functools.cache
def package_dir() -> Path | None:
    """Where the package is installed, found without importing it; None if it is not."""
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        return None
    places = spec.submodule_search_locations if spec is not None else None
    return Path(next(iter(places))) if places else None


async def vendor_file(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in FILES:
        return PlainTextResponse("not found", status_code=404)
    where = package_dir()
    relative, media_type = FILES[name]
    path = where / relative if where is not None else None
    if path is None or not path.is_file():
        return PlainTextResponse(
            f"the curves' script comes with the {PACKAGE} package: {INSTALL}", status_code=503
        )
    return FileResponse(path, media_type=media_type)


def vendor_routes() -> list[Route]:
    return [Route("/_dashboard/vendor/{name}", vendor_file, methods=["GET"])]
