"""The local Prime platform served by ``primeruns serve``.

A faithful stand-in of the platform's HTTP API (evaluations, environments hub,
external training runs and their object store, Prime Traces) on SQLite, with
fault injection, so that pipelines and this SDK can be tested over real HTTP
without credentials. :class:`LocalPlatform` runs it as a child process.

:class:`LocalPlatform` is imported when first asked for, not with the
package: it is a client of the platform (httpx, which brings its command
line's rich, pygments and click), and ``serve`` and the dashboard, which
import this package, are the server. ``serve --runs-dir`` spent half its
imports on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .handle import LocalPlatform

__all__ = ["LocalPlatform"]


def __getattr__(name: str) -> Any:
    if name == "LocalPlatform":
        from .handle import LocalPlatform

        globals()[name] = LocalPlatform  # asked for once
        return LocalPlatform
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    # The name is there before it is imported, as the package's own are
    # (``primeruns.__dir__``): a REPL's completion and ``help`` list it.
    return sorted({*globals(), *__all__})
