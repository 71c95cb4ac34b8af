"""The vendor's import name, ``prime_runs``, for code written against it.

``verifiers`` and other producers do ``import prime_runs as pr`` and
``from prime_runs.projection import build_samples``. This package makes those
imports return the very same module objects as ``primeruns`` (not copies), so
``isinstance`` checks, exceptions and module state agree whichever name a
caller used. It is installed as the top-level package ``prime_runs``.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import types
from collections.abc import Sequence
from typing import TYPE_CHECKING

import primeruns

if TYPE_CHECKING:
    import importlib.abc

    class _FinderLoader(importlib.abc.MetaPathFinder, importlib.abc.Loader): ...
else:
    _FinderLoader = object

_ALIAS = __name__  # "prime_runs" once installed
_TARGET = "primeruns"


class _AliasLoader(_FinderLoader):
    """Resolves ``prime_runs.X`` to the already-importable ``primeruns.X``.

    A finder and a loader by the methods the import system calls, not by
    ``importlib.abc``'s classes: importing that module loads
    ``importlib.resources`` and ``tempfile``, ~20 ms of ``import prime_runs``
    where no ``.pth`` file of site-packages loaded them already."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(_ALIAS + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        real = importlib.import_module(_TARGET + spec.name[len(_ALIAS) :])
        # importlib overwrites __spec__ on the module it is handed; keep the
        # real one so reloads and pickling still see `primeruns.X`.
        self._saved = real.__spec__
        return real

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__ = self._saved


if _ALIAS != _TARGET:
    sys.meta_path.insert(0, _AliasLoader())
    sys.modules[_ALIAS] = primeruns
