"""prime-traces' exception classes, without the HTTP clients its package loads.

The platform's errors *are* ``prime_traces.exceptions``' classes, so an
``except prime_traces.APIError`` written for the vendor's SDK catches ours.
Importing that module the usual way first runs ``prime_traces/__init__.py``,
which loads its HTTP clients, its pydantic models and asyncio: 0.1-0.3 s of
every process that opened a run or started an uplink, for a dozen classes
(0.27 s against 0.4 ms for the file alone, measured on a loaded 2-core
machine). The module itself imports only ``typing``.

So ``load()`` executes that one file under its own name and puts it in
``sys.modules``. When the package is imported later, by the user or by us,
its ``from .exceptions import ...`` finds this very module: one set of
classes either way. Python binds a submodule to its package only when it
loads it, so a one-shot finder sets ``prime_traces.exceptions`` on the
package once the package is loaded, as a usual import would have.

If anything is not as expected (the package already loading, no such file,
the file failing), ``load()`` imports the module the usual way.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

PACKAGE = "prime_traces"
NAME = PACKAGE + ".exceptions"

_lock = threading.Lock()


def load() -> ModuleType:
    """``prime_traces.exceptions``, loading only that file if nothing else of
    ``prime_traces`` is loaded yet."""
    module = sys.modules.get(NAME)
    if module is not None:
        return module
    with _lock:
        module = sys.modules.get(NAME)
        if module is not None:
            return module
        if PACKAGE in sys.modules:
            return importlib.import_module(NAME)
        module = _load_alone()
        if module is None:
            return importlib.import_module(NAME)
        # Executed before it is published, so no thread sees it half made; a
        # usual import that won the race keeps its module, and ours is dropped.
        published = sys.modules.setdefault(NAME, module)
        if published is module:
            sys.meta_path.insert(0, _BindOnPackageLoad(module))
        return published


def _load_alone() -> ModuleType | None:
    try:
        package = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        return None
    if package is None or not package.submodule_search_locations:
        return None
    path = Path(next(iter(package.submodule_search_locations))) / "exceptions.py"
    spec = importlib.util.spec_from_file_location(NAME, path)
    if spec is None or spec.loader is None or not path.is_file():
        return None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception:  # a changed file: import it the usual way
        return None
    return module


class _BindOnPackageLoad(importlib.abc.MetaPathFinder):
    """Sets ``prime_traces.exceptions`` on the package when it is loaded after
    the module, then leaves ``sys.meta_path``."""

    def __init__(self, module: ModuleType) -> None:
        self._module = module

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != PACKAGE:
            return None
        with _lock:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
        # The finders after this one, in order, as the import system asks them.
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            spec: importlib.machinery.ModuleSpec | None = (
                find(fullname, path, target) if find is not None else None
            )
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _BindingLoader(spec.loader, self._module)
                return spec
        return None


class _BindingLoader(importlib.abc.Loader):
    """The package's own loader, binding the module once the package is run."""

    def __init__(self, inner: importlib.abc.Loader, module: ModuleType) -> None:
        self._inner = inner
        self._module = module

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.exceptions = self._module  # type: ignore[attr-defined]
        # The package keeps its own loader (resources, reloads), not this one.
        module.__loader__ = self._inner
        if module.__spec__ is not None:
            module.__spec__.loader = self._inner
        self._inner.exec_module(module)
