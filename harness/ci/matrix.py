"""The TF x Keras x CUDA version matrix (``docker/matrix.toml``): loading and what derives from it.

One file pins every supported combination; tox envs, the asv matrix, image
build arguments and workflow matrices are derived from it or checked against it
(``tests/unit/test_matrix.py``), so they can never silently disagree.

Most entries are TensorFlow ones (``backend = "tensorflow"``, the default): TensorFlow and the Keras it runs.
An entry with ``backend = "jax"`` is Keras 3 on JAX without TensorFlow (``jax011``): it pins ``jax`` (jaxlib
the same) instead of ``tensorflow``, which it must leave out or empty. Whatever reads every entry and needs
TensorFlow (the asv matrix, the newest entry, harness init's files) takes the TensorFlow entries only.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from harness.ci.render import render_template
from harness.errors import InvalidValue, Unavailable

__all__ = ["Entry", "load_matrix", "default_path", "tox_deps", "newest", "build_args", "bake_file", "render_bake",
           "CPU_BASE", "BACKENDS", "framework_requirement"]

CPU_BASE = "debian:bookworm-slim"
VARIANTS = ("cpu", "gpu")
BACKENDS = ("tensorflow", "jax")

_NAME = re.compile(r"^[a-z][a-z0-9]*$")
_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?$")


@dataclass(frozen=True)
class Entry:
    """One pinned combination."""

    name: str
    keras: str  # "2" (bundled with TF <= 2.15), "3", "3.x.y" (pinned), or "tf-keras X.Y.Z" (legacy Keras 2)
    python: str
    cuda: str
    cudnn: str
    gpu_base: str
    tensorflow: str = ""  # the TensorFlow version; "" for a jax entry
    backend: str = "tensorflow"  # Keras' backend: "tensorflow", or "jax" (Keras 3 on JAX, no TensorFlow)
    jax: str = ""  # the JAX (and jaxlib) version of a jax entry; "" for a TensorFlow one
    cpu_base: str = ""  # the CPU variant's base image; "" for CPU_BASE (Debian bookworm: Python 3.11)
    newest: bool = False
    env: dict = field(default_factory=dict)

    @property
    def keras_major(self) -> int:
        return 2 if self.keras == "2" or self.keras.startswith("tf-keras") else 3

    @property
    def has_tensorflow(self) -> bool:
        """Whether the entry installs TensorFlow (every backend but jax)."""
        return self.backend == "tensorflow"

    @property
    def tf_minor(self) -> str:
        """``2.21`` of TensorFlow 2.21.0; ``""`` for an entry without TensorFlow."""
        return ".".join(self.tensorflow.split(".")[:2]) if self.has_tensorflow else ""

    @property
    def framework(self) -> str:
        """``TensorFlow 2.21.0`` or ``JAX 0.11.2``: what the entry runs Keras on, for messages and reports."""
        return f"TensorFlow {self.tensorflow}" if self.has_tensorflow else f"JAX {self.jax}"


def default_path() -> Path:
    """``docker/matrix.toml`` of the checkout harness runs from (editable install), else of the
    current directory or its nearest parent that has one (an installed harness run in a checkout)."""
    beside = Path(__file__).resolve().parent.parent / "docker" / "matrix.toml"
    if beside.exists():
        return beside
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / "docker" / "matrix.toml").exists():
            return folder / "docker" / "matrix.toml"
    return beside


def load_matrix(path: Path | str | None = None) -> list[Entry]:
    """Reads and validates the matrix.

    Raises:
        ValueError: naming the entry and field that is missing or malformed (a jax entry with a
            TensorFlow version, a TensorFlow entry with a JAX one), duplicate names, or not exactly
            one ``newest`` entry, or a ``newest`` one without TensorFlow.
    """
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python < 3.11
        try:
            import tomli as tomllib
        except ImportError:
            raise Unavailable("reading docker/matrix.toml needs Python >= 3.11 or the tomli package") from None

    path = Path(path) if path is not None else default_path()
    with open(path, "rb") as f:
        data = tomllib.load(f)
    raw = data.get("entry")
    if not isinstance(raw, list) or not raw:
        raise InvalidValue(f"{path}: needs [[entry]] tables; found none")
    entries = [_entry(item, f"{path}: entry {i + 1} ({item.get('name', '?')})") for i, item in enumerate(raw)]
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise InvalidValue(f"{path}: entry names must be unique; got {names}")
    if sum(e.newest for e in entries) != 1:
        raise InvalidValue(f"{path}: exactly one entry must say newest = true")
    top = newest(entries)
    if not top.has_tensorflow:
        raise InvalidValue(f"{path}: entry {top.name} says newest = true but has backend = {top.backend!r}; the "
                           "newest entry pins tox's default, gpu and bench envs and asv.conf.json, all TensorFlow: "
                           "it must be a TensorFlow entry")
    return entries


def _entry(item: dict, where: str) -> Entry:
    """One ``[[entry]]`` table as an Entry; ``where`` names it in every message.

    Raises:
        InvalidValue: a missing, unknown or malformed field; a TensorFlow version on a jax entry or a JAX
            version on a TensorFlow one.
    """
    backend = item.get("backend", "tensorflow")
    if backend not in BACKENDS:
        raise InvalidValue(f"{where}: backend must be one of {list(BACKENDS)}; got {backend!r}")
    framework = backend  # the field that pins it: tensorflow or jax
    required = ("name", framework, "keras", "python", "cuda", "cudnn", "gpu_base")
    missing = [k for k in required if k not in item or item[k] == ""]
    if missing:
        raise InvalidValue(f"{where}: missing {', '.join(missing)}"
                           + (f" (backend = {backend!r})" if backend != "tensorflow" else ""))
    unknown = set(item) - set(Entry.__dataclass_fields__)
    if unknown:
        raise InvalidValue(f"{where}: unknown field(s) {sorted(unknown)}")
    if not _NAME.match(item["name"]):
        raise InvalidValue(f"{where}: name must be lower-case letters and digits; got {item['name']!r}")
    if backend == "jax":
        if item.get("tensorflow", ""):
            raise InvalidValue(f"{where}: tensorflow must be absent or empty on a backend = 'jax' entry (Keras 3 "
                               f"on JAX, no TensorFlow); got tensorflow = {item['tensorflow']!r}")
        if not _VERSION.match(str(item["keras"])) or str(item["keras"]).split(".")[0] != "3":
            raise InvalidValue(f"{where}: keras must be a pinned Keras 3 version like 3.15.1 on a backend = 'jax' "
                               f"entry; got keras = {item['keras']!r}")
    elif item.get("jax", ""):
        raise InvalidValue(f"{where}: jax must be absent or empty on a backend = 'tensorflow' entry (set backend = "
                           f"'jax' for Keras 3 on JAX); got jax = {item['jax']!r}")
    for key in (framework, "python", "cuda", "cudnn"):
        if not _VERSION.match(str(item[key])):
            raise InvalidValue(f"{where}: {key} must be a version like "
                               f"{'0.11.2' if key == 'jax' else '2.21.0'}; got {item[key]!r}")
    if not isinstance(item.get("cpu_base", ""), str):
        raise InvalidValue(f"{where}: cpu_base must be an image name like ubuntu:24.04; got {item['cpu_base']!r}")
    return Entry(**item)


def newest(entries: list[Entry]) -> Entry:
    return next(e for e in entries if e.newest)


def tox_deps(entry: Entry) -> list[str]:
    """The pip requirements a CPU tox env of ``entry`` installs (a jax entry: Keras, JAX and jaxlib, in the order
    tox.ini's ``[testenv:jax011]`` lists them)."""
    if not entry.has_tensorflow:
        return [f"keras=={entry.keras}", f"jax=={entry.jax}", f"jaxlib=={entry.jax}"]
    deps = [f"tensorflow-cpu=={entry.tensorflow}"]
    if entry.keras.startswith("tf-keras"):
        deps.append(f"tf-keras=={entry.keras.split()[-1]}")
    elif _VERSION.match(entry.keras):
        deps.append(f"keras=={entry.keras}")
    return deps


def _keras_requirement(entry: Entry) -> str:
    if entry.keras.startswith("tf-keras"):
        return f"tf-keras=={entry.keras.split()[-1]}"
    if _VERSION.match(entry.keras):
        return f"keras=={entry.keras}"
    return ""  # the Keras TF itself depends on


def framework_requirement(entry: Entry, variant: str = "cpu") -> str:
    """The framework's pip requirements, space-separated (the Dockerfile's ``FRAMEWORK_REQUIREMENT``).

    TensorFlow entries: ``tensorflow-cpu==X`` (CPU) or ``tensorflow[and-cuda]==X`` (GPU: its pip wheels bring CUDA
    and cuDNN). jax entries: ``jax==X jaxlib==X`` (CPU) or ``jax[cudaN]==X jaxlib==X`` (GPU: the CUDA N plugin
    with the NVIDIA pip wheels, N the entry's CUDA major version).
    """
    if not entry.has_tensorflow:
        jax = "jax" if variant == "cpu" else f"jax[cuda{entry.cuda.split('.')[0]}]"
        return f"{jax}=={entry.jax} jaxlib=={entry.jax}"
    tf_package = "tensorflow-cpu" if variant == "cpu" else "tensorflow[and-cuda]"
    return f"{tf_package}=={entry.tensorflow}"


def build_args(entry: Entry, variant: str = "cpu", cpu_base: str = CPU_BASE) -> dict[str, str]:
    """``docker build --build-arg`` values of ``docker/Dockerfile`` for one entry.

    Args:
        entry: the matrix entry.
        variant: ``"cpu"`` (``tensorflow-cpu``, or ``jax``, on Debian) or ``"gpu"`` (``tensorflow[and-cuda]``,
            or ``jax[cuda12]``, on the entry's CUDA base image); ``framework_requirement``.
        cpu_base: the image the CPU variant starts from, where the entry names none of its own (``cpu_base``:
            jax011's Ubuntu 24.04, for its Python 3.12).

    Raises:
        ValueError: for an unknown variant.
    """
    if variant not in VARIANTS:
        raise InvalidValue(f"variant must be one of {list(VARIANTS)}; got variant={variant!r}")
    return {
        "BASE_IMAGE": (entry.cpu_base or cpu_base) if variant == "cpu" else entry.gpu_base,
        "PYTHON": entry.python,
        "ENTRY": entry.name,
        "VARIANT": variant,
        "KERAS_BACKEND": entry.backend,
        "TENSORFLOW": entry.tensorflow or "none",  # the image's labels: "none" where it has no TensorFlow
        "JAX": entry.jax or "none",
        "KERAS": entry.keras.split()[-1] if entry.keras.startswith("tf-keras") else entry.keras,
        "FRAMEWORK_REQUIREMENT": framework_requirement(entry, variant),
        "KERAS_REQUIREMENT": _keras_requirement(entry),
        "CUDA": entry.cuda,
        "CUDNN": entry.cudnn,
        "TF_USE_LEGACY_KERAS": entry.env.get("TF_USE_LEGACY_KERAS", "0"),
    }


def image_tag(entry: Entry, variant: str = "cpu") -> str:
    """``harness:<entry>`` for the CPU image, ``harness:<entry>-gpu`` for the GPU one."""
    return f"harness:{entry.name}" if variant == "cpu" else f"harness:{entry.name}-gpu"


def bake_file(entries: list[Entry]) -> str:
    """The text of ``docker/docker-bake.hcl``: one target per entry and variant (``render_bake``).

    ``docker buildx bake --file docker/docker-bake.hcl tf221`` builds the CPU
    image of ``tf221``; ``tf221-gpu`` its GPU image; groups ``cpu`` and ``gpu``
    build all. ``OFFLINE=1`` installs only from ``docker/wheelhouse``.
    """
    return render_bake(entries, image="harness", variables={"OFFLINE": "0", "CPU_BASE": CPU_BASE},
                       context="docker", dockerfile="Dockerfile", own=True,
                       notes={"CPU_BASE": ["The CPU images' base, but for an entry with a cpu_base of its own (jax011: "
                                           "ubuntu:24.04, for Python 3.12)."]})


def render_bake(entries: list[Entry], *, image: str, variables: Mapping[str, str], context: str, dockerfile: str,
                own: bool, notes: Mapping[str, list[str]] | None = None) -> str:
    """A docker-bake.hcl from the template ``harness-bake.hcl.j2``, the one layout of harness' own bake file
    (``bake_file``) and of the one ``harness init`` writes (``harness.ci.adopt``).

    Args:
        entries: the matrix entries: a target ``ENTRY`` (CPU) and ``ENTRY-gpu`` (GPU) each, tagged ``IMAGE:TARGET``,
            with ``build_args``; groups ``cpu`` and ``gpu`` name them all, ``default`` is ``cpu``.
        image: the images' name (``harness``).
        variables: the bake file's variables, name -> default, in order. ``CPU_BASE`` is the CPU variant's
            ``BASE_IMAGE`` of every entry without a ``cpu_base`` of its own (jax011 keeps its Ubuntu 24.04);
            each other one is also a build arg of every target, of the same name.
        context, dockerfile: the targets' build context and Dockerfile.
        own: harness' own bake file (its header says how it is generated), else the one harness init writes.
        notes: comment lines (without the '# ') written above a variable, by name.
    """
    names = {variant: [entry.name + ("" if variant == "cpu" else "-gpu") for entry in entries] for variant in VARIANTS}
    passed = {name: f"${{{name}}}" for name in variables if name != "CPU_BASE"}
    targets = []
    for at, entry in enumerate(entries):
        for variant in VARIANTS:
            args = {**build_args(entry, variant, cpu_base="${CPU_BASE}"), **passed}
            targets.append({"name": names[variant][at], "tag": f"{image}:{names[variant][at]}", "args": args,
                            "width": max(len(k) for k in args)})
    return render_template("harness-bake.hcl.j2", own=own, context=context, dockerfile=dockerfile,
                           variables=[{"name": name, "default": default, "note": (notes or {}).get(name, [])}
                                      for name, default in variables.items()],
                           groups=list(names.items()), targets=targets)


def _as_json(entries: list[Entry]) -> str:
    import json
    from dataclasses import asdict

    return json.dumps([asdict(e) for e in entries])


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.ci.matrix json|bake|build-args NAME [--gpu]`` (used by workflows and the bake file)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m harness.ci.matrix", description=main.__doc__)
    parser.add_argument("what", choices=["json", "bake", "build-args", "names"])
    parser.add_argument("name", nargs="?", help="the entry, for build-args")
    parser.add_argument("--gpu", action="store_true", help="build-args of the GPU variant")
    parser.add_argument("--file", default=None, help="the matrix file (default docker/matrix.toml)")
    args = parser.parse_args(argv)
    entries = load_matrix(args.file)
    if args.what == "json":
        print(_as_json(entries))
    elif args.what == "names":
        print("\n".join(e.name for e in entries))
    elif args.what == "bake":
        print(bake_file(entries), end="")
    else:
        by_name = {e.name: e for e in entries}
        if args.name not in by_name:
            parser.error(f"build-args needs an entry name, one of {sorted(by_name)}; got {args.name!r}")
        for key, value in build_args(by_name[args.name], "gpu" if args.gpu else "cpu").items():
            print(f"--build-arg={key}={value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
