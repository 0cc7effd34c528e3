"""ruff and mypy are part of the test suite: the code passes both."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed; install the dev extra: pip install -e '.[dev]'")
    return found


@pytest.mark.parametrize("args", [["check", "."], ["format", "--check", "."]])
def test_ruff(args: list[str]) -> None:
    proc = subprocess.run([_tool("ruff"), *args], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


#: The folders the wheel installs under coterie/ (pyproject's package-dir).
MAPPED = ("runtime", "actors", "tools", "configs")


def installed_layout() -> Path:
    """The package as the wheel lays it out (coterie/runtime/…), as a tree of
    links into the checkout: mypy follows neither setuptools' package-dir
    mapping nor the editable install's import hook. The tree's place is fixed
    so that mypy's cache stays valid from one run to the next."""
    tree = ROOT / ".mypy_tree"
    package = tree / "coterie"
    if tree.exists():
        shutil.rmtree(tree)
    package.mkdir(parents=True)
    for entry in (ROOT / "coterie").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for folder in MAPPED:
        (package / folder).symlink_to(ROOT / folder, target_is_directory=True)
    return tree


def test_mypy() -> None:
    tree = installed_layout()
    proc = subprocess.run(
        [
            _tool("mypy"),
            *("--config-file", str(ROOT / "pyproject.toml")),
            *("--cache-dir", str(ROOT / ".mypy_cache")),
            *("-p", "coterie"),
        ],
        cwd=tree,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Every module of the four folders was checked, not only coterie/'s.
    checked = int(re.search(r"(\d+) source files?", proc.stdout)[1])  # type: ignore[index]
    assert checked >= sum(1 for top in ("coterie", *MAPPED) for _ in (ROOT / top).rglob("*.py")), (
        proc.stdout
    )
