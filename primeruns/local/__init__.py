"""The local Prime platform served by ``primeruns serve``.

A faithful stand-in of the platform's HTTP API (evaluations, environments hub,
external training runs and their object store, Prime Traces) on SQLite, with
fault injection, so that pipelines and this SDK can be tested over real HTTP
without credentials. :class:`LocalPlatform` runs it as a child process.
"""

from __future__ import annotations

from .handle import LocalPlatform

__all__ = ["LocalPlatform"]
