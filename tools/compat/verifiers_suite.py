"""verifiers 0.4.0's own test suite, with this SDK installed in place of the vendor's.

``python tools/compat/verifiers_suite.py`` builds a virtual environment of
its own (``tools/compat/.verifiers``, reused by later runs) with verifiers
0.4.0 and its dependencies from PyPI, removes the vendor's ``prime-runs``
that verifiers depends on, installs this checkout in its place (it provides
the same ``prime_runs`` import name), and runs the tests of verifiers'
source distribution. Exit 1 if any test fails.

``test_color_codeword_tasks.py`` is left out: it imports an example package
that verifiers' own repository installs from its local sources, which its
source distribution does not carry.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import venv
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WORK = HERE / ".verifiers"
VERSION = "0.4.0"
TEST_TOOLS = ("pytest>=7.0.0,<9.1.0", "pytest-asyncio>=0.21.0")  # verifiers' dev group


def run(*command: str, cwd: Path | None = None) -> None:
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True, cwd=cwd)


def build() -> Path:
    """The environment's Python, with verifiers and this checkout's ``prime_runs``."""
    python = WORK / "venv" / "bin" / "python"
    if not python.exists():
        venv.create(WORK / "venv", with_pip=True, clear=True)
        run(str(python), "-m", "pip", "install", "-q", f"verifiers=={VERSION}", *TEST_TOOLS)
    run(str(python), "-m", "pip", "uninstall", "-y", "-q", "prime-runs")
    run(str(python), "-m", "pip", "install", "-q", "-e", str(ROOT))
    found = subprocess.run(
        [str(python), "-c", "import prime_runs; print(prime_runs.__file__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not Path(found).is_relative_to(ROOT):
        sys.exit(f"prime_runs comes from {found}, not this checkout")
    return python


def main() -> int:
    python = build()
    source = WORK / f"verifiers-{VERSION}"
    if not source.exists():
        run(
            str(python), "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
            "-d", str(WORK), f"verifiers=={VERSION}",
        )  # fmt: skip
        with tarfile.open(WORK / f"verifiers-{VERSION}.tar.gz") as sdist:
            sdist.extractall(WORK, filter="data")
    tests = ["tests", "--ignore=tests/v1/test_color_codeword_tasks.py"]
    proc = subprocess.run([str(python), "-m", "pytest", "-p", "no:cacheprovider", *tests],
                          cwd=source)  # fmt: skip
    return 0 if proc.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
