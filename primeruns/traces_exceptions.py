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

import contextlib
import importlib
import importlib.machinery
import importlib.util
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import importlib.abc

    _Finder = importlib.abc.MetaPathFinder
    _Loader = importlib.abc.Loader
else:
    # Plain classes at run time: importing ``importlib.abc`` loads
    # ``importlib.resources`` and tempfile (~20 ms where no ``.pth`` file of
    # site-packages loaded them), and the import system calls only the
    # methods each class has.
    _Finder = _Loader = object

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
        # In place first, so an import of the package that begins from now on,
        # in any thread, binds what it finds.
        finder = _BindOnPackageLoad()
        sys.meta_path.insert(0, finder)
        module = _load_alone()
        if module is None or PACKAGE in sys.modules:
            # No file to load alone; or an import of the package began
            # meanwhile (another thread), which may be past its look for this
            # module and load its own over ours: the usual import, which
            # waits for that one and returns what it made.
            finder.leave()
            return importlib.import_module(NAME)
        # Executed before it is published, so no thread sees it half made; a
        # usual import that won the race keeps its module, and ours is dropped.
        published = sys.modules.setdefault(NAME, module)
        package = sys.modules.get(PACKAGE)
        if package is not None:
            # An import of the package began before the finder was in place
            # (another thread): it will find this module and not bind it.
            finder.leave()
            _bind(package)
        return published


def _bind(package: ModuleType) -> None:
    """Set ``exceptions`` on the package, as a usual import of it would."""
    module = sys.modules.get(NAME)
    if module is not None and getattr(package, "exceptions", None) is not module:
        package.exceptions = module  # type: ignore[attr-defined]


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


class _BindOnPackageLoad(_Finder):
    """Binds ``prime_traces.exceptions`` on the package once the package is
    run, then leaves ``sys.meta_path``. A spec asked for and not run (a
    library checking that prime_traces is installed) leaves it in place."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != PACKAGE:
            return None
        # The finders after this one, in order, as the import system asks them.
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec: importlib.machinery.ModuleSpec | None = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _BindingLoader(spec.loader, self)
                return spec
        return None

    def leave(self) -> None:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)


class _BindingLoader(_Loader):
    """The package's own loader, binding the module once the package is run."""

    def __init__(self, inner: importlib.abc.Loader, finder: _BindOnPackageLoad) -> None:
        self._inner = inner
        self._finder = finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # The package keeps its own loader (resources, reloads), not this one.
        module.__loader__ = self._inner
        if module.__spec__ is not None:
            module.__spec__.loader = self._inner
        try:
            self._inner.exec_module(module)
        finally:
            self._finder.leave()
        _bind(module)
