"""The TF x Keras x CUDA version matrix (``docker/matrix.toml``): loading and what derives from it.

One file pins every supported combination; tox envs, the asv matrix, image
build arguments and workflow matrices are derived from it or checked against it
(``tests/unit/test_matrix.py``), so they can never silently disagree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Entry", "load_matrix", "default_path", "tox_deps", "newest"]

_NAME = re.compile(r"^[a-z][a-z0-9]*$")
_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?$")


@dataclass(frozen=True)
class Entry:
    """One pinned combination."""

    name: str
    tensorflow: str
    keras: str  # "2" (bundled with TF <= 2.15), "3", "3.x.y" (pinned), or "tf-keras X.Y.Z" (legacy Keras 2)
    python: str
    cuda: str
    cudnn: str
    gpu_base: str
    newest: bool = False
    env: dict = field(default_factory=dict)

    @property
    def keras_major(self) -> int:
        return 2 if self.keras == "2" or self.keras.startswith("tf-keras") else 3

    @property
    def tf_minor(self) -> str:
        return ".".join(self.tensorflow.split(".")[:2])


def default_path() -> Path:
    """``docker/matrix.toml`` of this checkout."""
    return Path(__file__).resolve().parent.parent / "docker" / "matrix.toml"


def load_matrix(path: Path | str | None = None) -> list[Entry]:
    """Reads and validates the matrix.

    Raises:
        ValueError: naming the entry and field that is missing or malformed,
            duplicate names, or not exactly one ``newest`` entry.
    """
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        try:
            import tomli as tomllib
        except ImportError:
            raise RuntimeError("reading docker/matrix.toml needs Python >= 3.11 or the tomli package") from None

    path = Path(path) if path is not None else default_path()
    with open(path, "rb") as f:
        data = tomllib.load(f)
    raw = data.get("entry")
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"{path}: needs [[entry]] tables; found none")
    entries = []
    for i, item in enumerate(raw):
        where = f"{path}: entry {i + 1} ({item.get('name', '?')})"
        missing = [k for k in ("name", "tensorflow", "keras", "python", "cuda", "cudnn", "gpu_base") if k not in item]
        if missing:
            raise ValueError(f"{where}: missing {', '.join(missing)}")
        unknown = set(item) - set(Entry.__dataclass_fields__)
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {sorted(unknown)}")
        if not _NAME.match(item["name"]):
            raise ValueError(f"{where}: name must be lower-case letters and digits; got {item['name']!r}")
        for key in ("tensorflow", "python", "cuda", "cudnn"):
            if not _VERSION.match(str(item[key])):
                raise ValueError(f"{where}: {key} must be a version like 2.21.0; got {item[key]!r}")
        entries.append(Entry(**item))
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: entry names must be unique; got {names}")
    if sum(e.newest for e in entries) != 1:
        raise ValueError(f"{path}: exactly one entry must say newest = true")
    return entries


def newest(entries: list[Entry]) -> Entry:
    return next(e for e in entries if e.newest)


def tox_deps(entry: Entry) -> list[str]:
    """The pip requirements a CPU tox env of ``entry`` installs."""
    deps = [f"tensorflow-cpu=={entry.tensorflow}"]
    if entry.keras.startswith("tf-keras"):
        deps.append(f"tf-keras=={entry.keras.split()[-1]}")
    elif _VERSION.match(entry.keras):
        deps.append(f"keras=={entry.keras}")
    return deps
