"""``harness init [DIR]``: adopt harness in another repository.

Writes, in DIR (default: here, a repository's root):

  harness.toml                          the workloads (--model) and how to split them (--devices, --ratios, ...)
  tests/test_harness_equivalence.py     pytest: each workload's parallel step equals its single-device step
  asv.conf.json, benchmarks/            asv suites of the workloads, thin subclasses of harness.suites
  tox.ini                               a ``gpu`` env (added where tox.ini exists only with --force)
  .github/workflows/harness-*.yml       CPU CI, the GPU suite on self-hosted runners, the PR benchmark
                                        gate (harness bench-compare), the nightly regressions and bisect
  docker/harness.Dockerfile, ...        an image per matrix entry with your package installed

It never overwrites: a file that exists with other content stops it before it
writes anything (all or nothing), naming each such file; ``--force`` replaces
them (tox.ini: appends the ``gpu`` env where it has none). ``--dry-run`` prints
every file it would write, and writes none. ``--reusable OWNER/REPO@SHA`` makes
the gate and nightly workflows call harness' reusable workflows, pinned by that
commit, instead of carrying their steps.

A workload is ``--model [NAME=]REF``: REF is ``MODULE:ATTR`` or
``path/to/file.py:ATTR`` naming a function that returns a compiled keras.Model,
or a harness.Workload (docs/user-models.md); NAME defaults to ATTR (or the
module's last part where ATTR is ``build``). ``--data [NAME=]REF`` gives a
workload real data.

Examples:
    harness init --model mypkg.models:build_classifier
    harness init --model text=mypkg.text:build --data text=mypkg.text:batches --devices 2 --ratios 3 2
    harness init --model mypkg.models:build --dry-run
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from harness.errors import InvalidValue, Refused

__all__ = ["add_parser", "run", "render"]

_IDENT = re.compile(r"[^A-Za-z0-9_]+")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("init", help="adopt harness in a repository: config, tests, asv, workflows, Docker",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", nargs="?", default=".", help="the repository's root (default: here)")
    p.add_argument("--model", action="append", default=[], metavar="[NAME=]REF", required=True,
                   help="a workload: MODULE:ATTR or path/to/file.py:ATTR (repeatable)")
    p.add_argument("--data", action="append", default=[], metavar="[NAME=]REF",
                   help="a workload's data: MODULE:ATTR, (batch_size) -> tf.data.Dataset or arrays (repeatable)")
    p.add_argument("--devices", type=int, default=2, metavar="N",
                   help="devices to split over: GPUs where there are N, else N logical CPUs (default 2)")
    p.add_argument("--ratios", type=float, nargs="+", metavar="R", help="the uneven split, one per device")
    p.add_argument("--methods", nargs="+", choices=["towers", "mirrored"], default=["mirrored"],
                   help="harness' parallel methods to check and benchmark (default mirrored)")
    p.add_argument("--emulate", metavar="RATE,...", help="emulated devices for harness run/tune without GPUs")
    p.add_argument("--matrix", nargs="+", metavar="ENTRY", help="docker/matrix.toml entries (default: the newest)")
    p.add_argument("--batch-size", type=int, default=64, help="the benchmarks' global batch (default 64)")
    p.add_argument("--reusable", metavar="OWNER/REPO@SHA",
                   help="call harness' reusable workflows of that repository and commit")
    p.add_argument("--force", action="store_true", help="replace files that exist with other content")
    p.add_argument("--dry-run", action="store_true", help="print what would be written; write nothing")
    p.set_defaults(run=run)


def _named(values: list[str], flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values:
        name, sep, ref = value.partition("=")
        if not sep:
            name, ref = _default_name(value), value
        name = name.strip()
        if not name.isidentifier():
            raise InvalidValue(f"{flag} {value!r}: the workload's name {name!r} is not an identifier (NAME=REF)")
        if name in out:
            raise InvalidValue(f"{flag} {value!r}: workload {name!r} given twice")
        out[name] = ref.strip()
    return out


def _default_name(ref: str) -> str:
    module, _, attr = ref.rpartition(":")
    if attr in ("build", "workload", "model", "make_model", "build_model", "get_model"):
        attr = Path(module).stem if module.endswith(".py") else module.rpartition(".")[2]
    return _IDENT.sub("_", attr).strip("_") or "model"


def _package_name(root: Path) -> str:
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        from harness.project import read_toml

        name = read_toml(pyproject).get("project", {}).get("name")
        if isinstance(name, str) and name:
            return name
    return root.resolve().name


def config_text(models: dict[str, str], data: dict[str, str], args) -> str:
    """harness.toml's text (checked by ``harness.project.parse_config`` before anything is written)."""
    lines = ["# harness' configuration of this repository (harness init; docs: user-models.md of harness).",
             "# devices: GPUs where the machine has this many, else logical CPU devices.",
             f"devices = {args.devices}"]
    if args.ratios:
        lines.append(f"ratios = [{', '.join(f'{r:g}' for r in args.ratios)}]")
    lines.append(f"methods = [{', '.join(json.dumps(m) for m in args.methods)}]")
    if args.emulate:
        lines.append(f"emulate = {json.dumps(args.emulate)}  # harness calibrate --model: rates this host sustains")
    lines.append(f"matrix = [{', '.join(json.dumps(m) for m in args.matrix)}]  # docker/matrix.toml entries")
    for name, ref in models.items():
        lines += ["", f"[workloads.{name}]", f"model = {json.dumps(ref)}"]
        if name in data:
            lines.append(f"data = {json.dumps(data[name])}")
        lines.append(f"batch-size = {args.batch_size}  # the benchmarks' global batch")
    return "\n".join(lines) + "\n"


_PYTEST = '''"""harness: each workload's parallel training equals its single-device training (harness init wrote it).

For every workload of harness.toml, `harness check` trains it once on one device and once split over the
configured devices (logical CPU devices on a machine without GPUs; HARNESS_CHECK_DEVICES="/gpu:0 /gpu:1" names
others) from the same weights, in a process of its own, and judges the difference: exact, or as accurate as one
device (float64 reference). A failure names the workload, each method's verdict and the command to rerun.
"""

import os

import pytest

from harness.project import check_workload, load_project

PROJECT = load_project(__file__)
DEVICES = os.environ.get("HARNESS_CHECK_DEVICES", "").replace(",", " ").split() or None


@pytest.mark.parametrize("workload", [w.name for w in PROJECT.workloads])
def test_parallel_training_equals_single_device(workload):
    result = check_workload(PROJECT, workload, devices=DEVICES)
    assert result.passed, result.message
'''

_BENCHMARKS = '''"""asv benchmarks of this repository's workloads (harness.toml), written by `harness init`.

Each suite is harness' own (harness.suites) over the workloads of harness.toml: samples/s, step time,
peak memory, fidelity to one device and time to accuracy.
"""

from harness import suites


class Throughput(suites.Throughput):
    pass


class StepTime(suites.StepTime):
    pass


class PeakMemory(suites.PeakMemory):
    pass


class Fidelity(suites.Fidelity):
    pass


class TimeToAccuracy(suites.TimeToAccuracy):
    pass
'''


def asv_config(package: str, entry) -> str:
    """asv.conf.json: the repository's commits built in virtualenvs with harness and the newest matrix entry."""
    from harness.ci.matrix import tox_deps

    req: dict[str, list[str]] = {"keras-harness[bench]": [""]}
    for dep in tox_deps(entry):
        name, _, version = dep.partition("==")
        req[name] = [version]
    conf = {"version": 1, "project": package, "project_url": "#", "repo": ".", "dvcs": "git", "branches": ["main"],
            "environment_type": "virtualenv", "pythons": [entry.python], "matrix": {"req": req},
            "launch_method": "spawn", "benchmark_dir": "benchmarks", "results_dir": ".asv/results",
            "html_dir": ".asv/html", "env_dir": ".asv/env", "build_cache_size": 2,
            "default_benchmark_timeout": 600}
    return json.dumps(conf, indent=4) + "\n"


def render(root: Path, args) -> tuple[dict[str, str], str | None]:
    """Every file ``harness init`` writes (relative path -> text), and tox.ini's ``gpu`` section.

    Raises:
        InvalidValue: a bad option (the config is checked as ``harness.project`` will read it).
    """
    from harness.ci import adopt
    from harness.ci.matrix import load_matrix
    from harness.project import parse_config, read_toml_text

    entries = adopt.matrix_entries(args.matrix or [adopt.newest_entry(load_matrix(adopt.MATRIX)).name])
    args.matrix = [e.name for e in entries]
    models, data = _named(args.model, "--model"), _named(args.data, "--data")
    strays = sorted(set(data) - set(models))
    if strays:
        raise InvalidValue(f"--data for {strays[0]!r}, which no --model names (workloads: {', '.join(models)})")
    text = config_text(models, data, args)
    project = parse_config(read_toml_text(text, root / "harness.toml"), root / "harness.toml")
    package = _package_name(root)
    files = {"harness.toml": text, "tests/test_harness_equivalence.py": _PYTEST,
             "asv.conf.json": asv_config(package, adopt.newest_entry(entries)),
             "benchmarks/__init__.py": "", "benchmarks/harness_suites.py": _BENCHMARKS}
    ci = adopt.ci_files(project, package, reusable=args.reusable)
    gpu = ci.pop("tox.ini", None)
    files.update(ci)
    return files, gpu


def run(args) -> int:
    root = Path(args.dir)
    if not root.is_dir():
        raise InvalidValue(f"harness init: {root} is not a folder")
    if args.devices < 1:
        raise InvalidValue(f"--devices must be at least 1; got {args.devices}")
    files, tox_gpu = render(root, args)
    tox = root / "tox.ini"
    plan: list[tuple[str, str, str]] = []  # (path, action, text)
    conflicts = []
    for rel, text in files.items():
        path = root / rel
        if not path.exists():
            plan.append((rel, "write", text))
        elif path.is_file() and path.read_text() == text:
            plan.append((rel, "unchanged", text))
        else:
            conflicts.append(rel)
            plan.append((rel, "replace", text))
    if tox_gpu is not None:
        if not tox.exists():
            plan.append(("tox.ini", "write", tox_gpu))
        elif "[testenv:gpu]" in tox.read_text():
            plan.append(("tox.ini", "unchanged (has a [testenv:gpu] already)", ""))
        else:
            conflicts.append("tox.ini")
            plan.append(("tox.ini", "append the gpu env to", "\n" + tox_gpu))
    if args.dry_run:
        for rel, action, text in plan:
            print(f"=== would {action}: {rel}" if action in ("write", "replace", "append the gpu env to")
                  else f"=== {rel}: {action}")
            if action not in ("unchanged",) and text:
                print(text, end="" if text.endswith("\n") else "\n")
        if conflicts and not args.force:
            print(f"harness init: {len(conflicts)} file(s) exist with other content and need --force: "
                  f"{', '.join(conflicts)}", file=sys.stderr)
        return 0
    if conflicts and not args.force:
        raise Refused("files-exist", f"these files exist with other content: {', '.join(conflicts)}; nothing was "
                      "written (--force replaces them; --dry-run shows what harness init writes)")
    for rel, action, text in plan:
        path = root / rel
        if action in ("write", "replace"):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        elif action.startswith("append"):
            with path.open("a") as handle:
                handle.write(text)
        print(f"harness init: {action:<9} {rel}" if not action.startswith("append")
              else f"harness init: appended the gpu env to {rel}", file=sys.stderr)
    print(f"harness init: done; next: `pytest tests/test_harness_equivalence.py`, `harness check --model "
          f"{next(iter(_named(args.model, '--model').values()))}`, `asv run --quick` (add .asv/ to .gitignore)",
          file=sys.stderr)
    return 0
