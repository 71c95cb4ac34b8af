"""Install every declared lower bound and run the tests that use each dependency.

Why: a floor in pyproject.toml is a promise that the oldest version it admits
works. pip only ever installs the newest, so a floor nobody installs rots (the
local platform once failed to import at its declared python-multipart floor while
`pip check` was content). This tool makes the promise checked: it pins every
``name>=X`` of the project's dependencies and extras to ``name==X`` in a
constraints file, installs the project with them into a virtual environment of
its own, runs `pip check`, then the tests that exercise each dependency.

    python3 tools/floors.py            # build the venv, install floors, test
    python3 tools/floors.py --list     # only print the floors it would pin

Exit status: 0 when the floors install and the tests pass, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The tests that import each dependency the floors pin: the journal (lmdb,
# zstandard, orjson, cattrs), every sink (httpx, pyarrow, prime-traces, isal), the
# local platform and its dashboard pages (uvicorn, starlette, python-multipart,
# jinja2, youplot, anyio, markupsafe, msgspec), the CLI (rich), and hypothesis's
# property tests. The browser tests are left out: they test Chromium, not a floor.
FLOOR_TESTS = (
    "tests/journal/test_api.py",
    "tests/journal/test_properties.py",
    "tests/test_records.py",
    "tests/test_spec.py",
    "tests/test_platform_errors.py",
    # The API's small calls on http.client answer and fail as httpx's did, at
    # httpx's and httpcore's floors too.
    "tests/test_platform_plain.py",
    "tests/sinks",
    "tests/local/test_platform_api.py",
    "tests/local/test_dashboard_pages.py",
    "tests/local/test_dashboard_charts.py",
    "tests/local/test_dashboard_narrow_rows.py",
    "tests/local/test_security_bounds.py",
    # serve pins uvicorn's h11 protocol and its head limit.
    "tests/local/test_security_head.py",
    # What orjson writes and refuses differs by version (the sign of a float's
    # exponent; whether an empty array counts toward its depth limit).
    "tests/local/test_jsonlimits.py",
    "tests/cli/test_cli_conventions.py",
    "tests/test_sdk_eval.py",
    "tests/test_sdk_train.py",
)

_LOWER_BOUND = re.compile(
    r"^\s*([A-Za-z0-9_.\-]+)\s*>=\s*([0-9][^,;\s]*)\s*(?:,\s*<\s*[0-9][^,;\s]*\s*)?(?:;.*)?$"
)


def declared_floors(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, str]:
    """Every ``name>=version`` the project declares, in its dependencies and extras.

    A lower bound is a floor, with or without an upper bound beside it (the
    floor satisfies both); an exact pin or a marker that names another
    platform is left as declared.
    """
    project = tomllib.loads(pyproject.read_text())["project"]
    requirements = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        requirements.extend(extra)
    floors: dict[str, str] = {}
    for requirement in requirements:
        match = _LOWER_BOUND.match(requirement)
        if match is None or match.group(1).lower() == project["name"]:
            continue
        if ";" in requirement:
            # A marker (atheris: Linux x86_64 only): pin it only where it applies.
            marker = requirement.split(";", 1)[1]
            floors[match.group(1).lower()] = f"{match.group(2)} ;{marker}"
        else:
            floors[match.group(1).lower()] = match.group(2)
    return floors


def constraints_text(floors: dict[str, str]) -> str:
    lines = []
    for name, version in sorted(floors.items()):
        if ";" in version:
            number, marker = version.split(";", 1)
            lines.append(f"{name}=={number.strip()} ;{marker}")
        else:
            lines.append(f"{name}=={version}")
    return "\n".join(lines) + "\n"


def _run(command: list[str], **kwargs: object) -> int:
    print("$", " ".join(command), flush=True)
    return subprocess.run(command, check=False, **kwargs).returncode  # type: ignore[call-overload, no-any-return]


def check_floors(work: Path) -> int:
    floors = declared_floors()
    constraints = work / "floors.txt"
    constraints.write_text(constraints_text(floors))
    print(constraints.read_text(), end="", flush=True)
    venv = work / "venv"
    if _run([sys.executable, "-m", "venv", str(venv)]):
        return 1
    python = str(venv / "bin" / "python")
    # Installed as a regular (not editable) package from the checkout, so the
    # tests import what the floors built, not this interpreter's packages.
    if _run(
        [python, "-m", "pip", "install", "--quiet", "-c", str(constraints), f"{ROOT}[all,test]"]
    ):
        print("the declared floors do not install together", file=sys.stderr)
        return 1
    if _run([python, "-m", "pip", "check"]):
        return 1
    # The checkout's tests run on the venv's interpreter: every dependency is
    # the floor installed there (the code under test is the checkout's own).
    env = {key: value for key, value in os.environ.items() if not key.startswith("PRIME")}
    env.pop("PYTHONPATH", None)
    env["PRIME_RUNS_DIR"] = str(work / "runs")
    return _run(
        [
            python,
            "-m",
            "pytest",
            "-q",
            "-rs",  # a skip at the floors names its reason in CI's log
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(ROOT),
            "-c",
            str(ROOT / "pyproject.toml"),
            *(str(ROOT / path) for path in FLOOR_TESTS),
        ],
        cwd=work,
        env=env,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="print the pinned floors and exit")
    args = parser.parse_args(argv)
    if args.list:
        print(constraints_text(declared_floors()), end="")
        return 0
    with tempfile.TemporaryDirectory(prefix="prime-runs-floors-") as work:
        status = check_floors(Path(work))
    print("floors:", "ok" if status == 0 else "FAILED", flush=True)
    return 0 if status == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
