"""The distribution's shape: every package is listed, the public names are the
vendor's, and ``import prime_runs`` is this very package."""

from __future__ import annotations

import tomllib
from pathlib import Path

import primeruns

ROOT = Path(__file__).resolve().parents[1]

# The names code written for the vendor's prime-runs 0.1.4 imports.
VENDOR_NAMES = {
    "init", "Run", "RunStatus", "RunKind", "TrainingSpec", "ConfigSource", "CONFIG_SOURCE_KEY",
    "EnvironmentRef", "TRACES_OPT_OUT_ENV", "MODE_ENV", "metrics", "projection",
    "PrimeRunsError", "ConfigurationError", "EnvironmentResolutionError", "APIError",
    "RunFinishedError", "ForbiddenError", "NotFoundError", "PaymentRequiredError",
    "RetryableAPIError", "TransportError", "UnauthorizedError",
}  # fmt: skip


def test_every_package_folder_is_listed_in_pyproject() -> None:
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "primeruns").rglob("__init__.py")
        if "_compat" not in p.parts
    }
    assert found | {"prime_runs"} == listed


def test_public_names_cover_the_vendor_api() -> None:
    assert set(primeruns.__all__) >= VENDOR_NAMES
    for name in primeruns.__all__:
        assert hasattr(primeruns, name), name


def test_the_vendor_import_name_gives_the_same_objects() -> None:
    import prime_runs
    import prime_runs.exceptions
    import prime_runs.projection

    assert prime_runs is primeruns
    assert prime_runs.projection is primeruns.projection
    assert prime_runs.exceptions.APIError is primeruns.APIError
    assert primeruns.projection.__spec__ is not None
    assert primeruns.projection.__spec__.name == "primeruns.projection"
