"""The charting script the curves are drawn with, served from its installed package.

The dashboard draws with uPlot (chosen by ``tools/bench/chart_choice.py``).
It is not copied into this repository and not fetched from a CDN: the
``youplot`` wheel, a dependency of the ``local`` extra, ships uPlot's own
``dist`` files (1.6.31, byte for byte the npm package's), and this module
serves those two files at ``/_dashboard/vendor/``. Nothing of ``youplot`` is
imported: its package folder is found by its import spec alone. Without it,
the route answers 503 naming the install, and the curves say their script
did not load (the captions still give each metric's last value).

The files are served only if their SHA-256 is that of uPlot 1.6.31 as npm
publishes it (``npm pack uplot@1.6.31``, ``dist/``): the wheel has a single
release from a publisher with no project page, so what it ships next is not
taken on trust; a script that runs in every dashboard page must be the one
that was measured and reviewed. Another uPlot is a deliberate change here.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
from pathlib import Path

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

#: The package that ships the script, and the files served from it, by name.
PACKAGE = "youplot"
FILES = {
    "uplot.js": ("vendor/uplot.iife.min.js", "text/javascript; charset=utf-8"),
    "uplot.css": ("vendor/uplot.min.css", "text/css; charset=utf-8"),
}
#: uPlot 1.6.31's ``dist/uPlot.iife.min.js`` and ``dist/uPlot.min.css`` (npm).
SHA256 = {
    "uplot.js": "2d27e8ad3d228164525ce213f9dc716f39b4e3aee0cc773fb3491c96cf4921a2",
    "uplot.css": "df630c6a8d6f8eeaff264b50f73ce5b114f646ffd9a0bb74f049b0a00135fa04",
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


@functools.cache
def _checked(path: Path, name: str) -> bytes | None:
    """The file's bytes if they are the uPlot this module names, else None
    (read and hashed once: 50 KB, kept for the server's life)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return data if hashlib.sha256(data).hexdigest() == SHA256[name] else None


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
    data = _checked(path, name)
    if data is None:
        return PlainTextResponse(
            f"the installed {PACKAGE} ships a {relative} that is not uPlot 1.6.31 as npm "
            f"publishes it (SHA-256 differs), so it is not served: "
            f"pip install '{PACKAGE}==1.0.0'",
            status_code=503,
        )
    return Response(data, media_type=media_type)


def vendor_routes() -> list[Route]:
    return [Route("/_dashboard/vendor/{name}", vendor_file, methods=["GET"])]
