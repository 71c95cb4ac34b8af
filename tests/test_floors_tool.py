"""tools/floors.py pins what pyproject.toml declares, so CI installs the floors
the project promises (a floor nobody installs rots: python-multipart's once did)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _floors_module():
    spec = importlib.util.spec_from_file_location("floors", ROOT / "tools" / "floors.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["floors"] = module
    spec.loader.exec_module(module)
    return module


def test_every_lower_bound_of_the_project_is_pinned(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[project]\nname = "prime-runs"\n'
        'dependencies = ["lmdb>=1.4.1", "rich>=13", "exact==1.0", "ranged>=2,<3"]\n'
        "[project.optional-dependencies]\n"
        'local = ["starlette>=0.41.2"]\n'
        'all = ["prime-runs[local]"]\n'
        "test = [\"atheris>=2.3; sys_platform == 'linux'\"]\n"
    )
    floors = _floors_module()
    declared = floors.declared_floors(pyproject)
    assert declared == {
        "lmdb": "1.4.1",
        "rich": "13",
        "starlette": "0.41.2",
        "atheris": "2.3 ; sys_platform == 'linux'",
        "ranged": "2",  # its floor satisfies its upper bound too
    }
    text = floors.constraints_text(declared)
    assert "lmdb==1.4.1\n" in text and "starlette==0.41.2\n" in text
    assert "atheris==2.3 ; sys_platform == 'linux'\n" in text
    assert "ranged==2\n" in text
    # an exact pin is left as declared
    assert "exact" not in text


def test_the_floors_the_repository_declares_include_every_runtime_dependency() -> None:
    floors = _floors_module().declared_floors()
    for name in (
        "lmdb",
        "zstandard",
        "httpx",
        "cattrs",
        "orjson",
        "prime-traces",
        "rich",
        "pyarrow",
        "uvicorn",
        "httptools",
        "starlette",
        "python-multipart",
        "jinja2",
        "youplot",
        "anyio",
        "markupsafe",
        "msgspec",
    ):
        assert name in floors, name
