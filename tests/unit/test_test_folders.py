"""The test folders never shadow a package: pytest puts each test file's folder (and tests/, for its conftest.py)
first on ``sys.path``, where a folder without ``__init__.py`` is a namespace package to ``import``. A folder named
like a package that is not installed is imported in its place (the JAX tests' folder, once named like JAX, was
``import jax`` in the image without JAX, and Keras then failed on ``jax.monitoring``); one named like an installed
package hides a missing extra's clear error behind an AttributeError."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]


def _import_names() -> set[str]:
    """The top-level import names of every installed distribution and of every requirement harness declares."""
    names = {name.lower() for name in metadata.packages_distributions()}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        requirements += extra
    for requirement in requirements:
        name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement).group(0).lower()
        names |= {name.replace("-", "_"), name.split("-")[0]}
    return names | {"jax", "jaxlib", "tensorflow", "tf_keras", "keras", "docker", "yaml", "harness"}


def _clashes(tests: Path) -> list[str]:
    folders = {p for p in tests.rglob("*") if p.is_dir() and p.name != "__pycache__"}
    return sorted(str(p.relative_to(tests.parent)) for p in folders if p.name.lower() in _import_names())


def test_no_test_folder_is_named_like_a_package():
    assert _clashes(ROOT / "tests") == [], "test folders named like packages: rename them"


def test_a_folder_named_like_a_package_is_caught(tmp_path):
    # Planted: the folders this repository had (tests/jax, tests/docker) beside harmless ones.
    for name in ("jax", "docker", "onjax", "images", "unit/helpers"):
        (tmp_path / "tests" / name).mkdir(parents=True)
    assert _clashes(tmp_path / "tests") == ["tests/docker", "tests/jax"]
