"""``harness init [DIR]``: adopt harness in another repository.

Writes, in DIR (default: here, a repository's root):

  harness.toml                          the workloads (--model) and how to split them (--devices, --ratios, ...)
  tests/test_harness_equivalence.py     pytest: each workload's parallel step equals its single-device step
  asv.conf.json, benchmarks/            asv suites of the workloads, thin subclasses of harness.suites
  tox.ini                               a ``gpu`` env (added where tox.ini exists only with --force)
  .github/workflows/harness-*.yml       CPU CI, the GPU suite on self-hosted runners, the PR benchmark
                                        gate (harness bench-compare), the nightly regressions and bisect
  docker/harness.Dockerfile, ...        an image per matrix entry with your package installed

It never overwrites your work. It records what it wrote (a hash per file, in
``.harness/init.json``); run again (``harness init`` alone re-renders from harness.toml,
e.g. after a harness upgrade), it updates the files you left as written, keeps
each file you edited since (naming it, and saying that its template changed), and
stops before writing anything (all or nothing) where a file it never wrote exists
with other content, naming each. ``--force`` replaces them all (tox.ini: appends
the ``gpu`` env where it has none). ``--dry-run`` prints every file it would write,
and writes none. ``--reusable OWNER/REPO@SHA`` makes the gate and nightly workflows
call harness' reusable workflows, pinned by that commit, instead of carrying their
steps.

Every generated file that installs harness installs ``--harness-requirement``
(default: the installed release as ``keras-harness==X.Y.Z``; a harness that is no
release, as a VCS URL or the file it was installed from, pinned: ``harness.dist``),
and the workflows run on ``--branch`` (default: the repository's default branch,
from git). harness.toml keeps both, so a re-run keeps them.

A workload is ``--model [NAME=]REF``: REF is ``MODULE:ATTR`` or
``path/to/file.py:ATTR`` naming a function that returns a compiled keras.Model,
or a harness.Workload (docs/user-models.md); NAME defaults to ATTR (or the
module's last part where ATTR is ``build``). ``--data [NAME=]REF`` gives a
workload real data (with one ``--model``, an unnamed ``--data`` is its).

``--backend jax`` (harness.toml: ``backend = "jax"``) checks the workloads on Keras 3's JAX
backend: the generated test runs ``harness check --backend jax`` on JAX CPU devices (method
towers; no TensorFlow; ``--data`` must return NumPy arrays), and the CPU workflow installs
``keras-harness[jax]`` instead of TensorFlow. The GPU workflow, the Docker images and tox's
gpu env still install the matrix' TensorFlow: their checks (``--backend jax`` too) need JAX's
CUDA build added there by hand; the asv suites are TensorFlow's.

Examples:
    harness init --model mypkg.models:build_classifier
    harness init --model text=mypkg.text:build --data text=mypkg.text:batches --devices 2 --ratios 3 2
    harness init --model mypkg.models:build --dry-run
    harness init --model mypkg.models:build --harness-requirement "keras-harness==0.3.1" --branch trunk
    harness init --model mypkg.models:build --backend jax --devices 3 --ratios 5 3 2   # Keras 3 on JAX
    harness init                                    # again, after a harness upgrade: from harness.toml
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

from harness.errors import InvalidValue, Refused

__all__ = ["add_parser", "run", "render"]

_IDENT = re.compile(r"[^A-Za-z0-9_]+")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("init", help="adopt harness in a repository: config, tests, asv, workflows, Docker",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", nargs="?", default=".", help="the repository's root (default: here)")
    p.add_argument("--model", action="append", default=[], metavar="[NAME=]REF",
                   help="a workload: MODULE:ATTR or path/to/file.py:ATTR (repeatable); none: re-render the files "
                        "from the repository's harness.toml")
    p.add_argument("--data", action="append", default=[], metavar="[NAME=]REF",
                   help="a workload's data: MODULE:ATTR, (batch_size) -> tf.data.Dataset or arrays (repeatable)")
    p.add_argument("--devices", type=int, default=None, metavar="N",
                   help="devices to split over: GPUs where there are N, else N logical CPUs (default 2)")
    p.add_argument("--ratios", type=float, nargs="+", metavar="R", help="the uneven split, one per device")
    p.add_argument("--methods", nargs="+", choices=["towers", "mirrored"], default=None,
                   help="harness' parallel methods to check and benchmark (default mirrored; on --backend jax towers)")
    p.add_argument("--backend", choices=["tensorflow", "jax"], default=None,
                   help="Keras' backend the generated test checks on: tensorflow (default), or jax: Keras 3 on JAX CPU "
                        "devices, method towers, no TensorFlow (harness.toml: backend)")
    p.add_argument("--emulate", metavar="RATE,...", help="emulated devices for harness run/tune without GPUs")
    p.add_argument("--matrix", nargs="+", metavar="ENTRY", help="docker/matrix.toml entries (default: the newest)")
    p.add_argument("--batch-size", type=int, default=64, help="the benchmarks' global batch (default 64)")
    p.add_argument("--reusable", metavar="OWNER/REPO@SHA",
                   help="call harness' reusable workflows of that repository and commit")
    p.add_argument("--harness-requirement", metavar="SPEC",
                   help="how the generated CI installs harness, a pip requirement (default: harness.toml's, else the "
                        "installed release as keras-harness==X.Y.Z, else a pinned VCS URL or file of this harness)")
    p.add_argument("--branch", metavar="NAME",
                   help="the branch the workflows test and benchmark (default: harness.toml's, else the "
                        "repository's default branch from git, else main)")
    p.add_argument("--no-measure", dest="measure", action="store_false",
                   help="do not run each workload's check to write what it expects (default: measured here, once, "
                        "as the generated test runs it; without: exact)")
    p.add_argument("--force", action="store_true", help="replace files that exist with other content")
    p.add_argument("--dry-run", action="store_true", help="print what would be written; write nothing")
    p.set_defaults(run=run)


def _named(values: list[str], flag: str, sole: str | None = None) -> dict[str, str]:
    """``[NAME=]REF`` values by name; an unnamed one is ``sole``'s where given (the one --model's --data)."""
    out: dict[str, str] = {}
    for value in values:
        name, sep, ref = value.partition("=")
        if not sep:
            name, ref = (sole if sole is not None else _default_name(value)), value
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


def config_text(models: dict[str, str], data: dict[str, str], args,
                expects: dict[str, tuple[str, str]] | None = None) -> str:
    """harness.toml's text, from the template ``harness.toml.j2`` (checked by ``harness.project.parse_config``
    before anything is written); ``expects``: workload -> (its ``expect`` value as TOML, the comment saying where it
    came from), default exact."""
    from harness.ci.render import render_template

    workloads = []
    for name, ref in models.items():
        expect, why = (expects or {}).get(name, ('"exact"', _NOT_MEASURED))
        workloads.append({"name": name, "model": _toml(ref), "data": _toml(data[name]) if name in data else None,
                          "expect": expect, "why": why})
    return render_template("harness.toml.j2", devices=_toml(args.devices),
                           ratios=_toml(args.ratios) if args.ratios else None, methods=_toml(args.methods),
                           backend=args.backend, emulate=_toml(args.emulate) if args.emulate else None,
                           matrix=_toml(args.matrix), batch_size=_toml(args.batch_size), workloads=workloads,
                           **_settings_values(args))


def _toml(value) -> str:
    """``value`` as a TOML value: a string quoted, in ASCII; an integer as it is; a float as ``%g`` where that is
    the same number (a ratio of 3.0 is ``3``), else in full; a list of them."""
    if isinstance(value, (list, tuple)):
        return f"[{', '.join(map(_toml, value))}]"
    if isinstance(value, int):
        return str(value)
    if not isinstance(value, str):
        short = f"{value:g}"
        return short if float(short) == value else repr(value)
    # JSON's escapes are TOML's, but for two: TOML has no surrogate pairs (\U0001F600, not \ud83d\ude00) and
    # escapes DEL, which JSON leaves as it is.
    quoted = json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    return "".join(c if c.isascii() else f"\\u{ord(c):04x}" if ord(c) < 0x10000 else f"\\U{ord(c):08x}"
                   for c in quoted)


_NOT_MEASURED = ('each method\'s outcome: "exact", "as accurate" or a refusal id; per method: { towers = "..." } '
                 "(not measured: harness init --no-measure or --dry-run)")


def measure(project, echo=print) -> dict[str, tuple[str, str]]:
    """Each workload's ``expect`` as this machine measures it (``check_workload``, the generated test's own check,
    on the project's logical CPU devices): workload -> (TOML value, comment). A method that comes out exact is
    expected exact where its deviation is at most half the workload's ``tol``, else as accurate (another
    machine's rounding must not fail it); as accurate and refusals as they come out. A FAIL or no verdict is
    never written as expected: such a workload expects exact, and ``echo`` says why its test will fail."""
    from harness.project import AS_ACCURATE, EXACT, check_workload, outcome

    out: dict[str, tuple[str, str]] = {}
    for entry in project.workloads:
        kind = "JAX CPU" if project.backend == "jax" else "logical CPU"
        echo(f"harness init: measuring {entry.name} ({entry.model}): harness check on {project.devices} {kind} "
             f"devices, methods {', '.join(project.methods)}")
        result = check_workload(project, entry.name)
        rows = [r for r in result.rows if not r.get("baseline")]
        if not rows or any(outcome(r) == "FAIL" for r in rows):
            echo(f"harness init: {entry.name}: not measured as expected, its test will fail until this is fixed "
                 f"(or expect set by hand):\n{result.message}")
            out[entry.name] = ('"exact"', "expected exact; harness init measured no outcome to expect (see its "
                                          "output): " + ("FAIL" if rows else "no verdict"))
            continue
        pins, said = {}, []
        for row in rows:
            got = outcome(row)
            deviation = row.get("max_deviation")
            if got == EXACT and deviation is not None and deviation > entry.tol / 2:
                got = AS_ACCURATE
                said.append(f"{row['method']} exact at {deviation:.2g}, within 2 x of tol {entry.tol:g}: expected "
                            "as accurate, which exact also meets")
            elif got == AS_ACCURATE:
                said.append(f"{row['method']} as accurate at {deviation:.2g}")
            elif got == EXACT:
                said.append(f"{row['method']} exact at {deviation:.2g}")
            else:
                said.append(f"{row['method']} refused ({got})")
            pins[row["method"]] = got
        if len(set(pins.values())) == 1:
            value = json.dumps(next(iter(pins.values())))
        else:
            value = "{ " + ", ".join(f"{m} = {json.dumps(o)}" for m, o in pins.items()) + " }"
        out[entry.name] = (value, "measured by harness init: " + "; ".join(said))
        echo(f"harness init: {entry.name}: expect = {value} ({'; '.join(said)})")
    return out


def _settings_values(args) -> dict[str, str]:
    """The values of ``_harness-settings.toml.j2``: the requirement and the branch, and why each."""
    return {"harness_requirement": _toml(args.harness_requirement), "requirement_why": args.requirement_why,
            "branch": _toml(args.branch), "branch_why": args.branch_why}


def _setting_lines(args) -> list[str]:
    """harness.toml's lines of the settings a re-run of harness init keeps: the requirement and the branch, as
    harness.toml.j2 writes them."""
    from harness.ci.render import render_template

    return render_template("_harness-settings.toml.j2", **_settings_values(args)).splitlines()


def _with_settings(text: str, args) -> str:
    """harness.toml's ``text`` with its requirement and branch lines set to ``args``' (added before its first table
    where it has none)."""
    lines = text.splitlines()
    first_table = next((i for i, line in enumerate(lines) if line.lstrip().startswith("[")), len(lines))
    for key, line in zip(("harness-requirement", "branch"), _setting_lines(args)):
        found = next((i for i in range(first_table) if re.match(rf"\s*{key}\s*=", lines[i])), None)
        if found is None:
            lines.insert(first_table, line)
            first_table += 1
        else:
            lines[found] = line
    return "\n".join(lines) + "\n"


def asv_config(package: str, entry, harness_requirement: str = "keras-harness", branch: str = "main") -> str:
    """asv.conf.json: the repository's commits on ``branch`` built in virtualenvs with harness
    (``harness_requirement``) and the newest matrix entry."""
    from harness.ci.adopt import requirement_with
    from harness.ci.matrix import tox_deps

    req: dict[str, list[str]] = {requirement_with(harness_requirement, ("bench",)): [""]}
    for dep in tox_deps(entry):
        name, _, version = dep.partition("==")
        req[name] = [version]
    conf = {"version": 1, "project": package, "project_url": "#", "repo": ".", "dvcs": "git", "branches": [branch],
            "environment_type": "virtualenv", "pythons": [entry.python], "matrix": {"req": req},
            "launch_method": "spawn", "benchmark_dir": "benchmarks", "results_dir": ".asv/results",
            "html_dir": ".asv/html", "env_dir": ".asv/env", "build_cache_size": 2,
            "default_benchmark_timeout": 600}
    return json.dumps(conf, indent=4) + "\n"


_BRANCH = re.compile(r"^(?!-)(?!.*\.\.)[A-Za-z0-9._/-]+(?<![./])$")
MANIFEST = ".harness/init.json"  # what harness init last wrote, per file: the base of a re-run's three-way merge


def default_branch(root: Path) -> tuple[str, str]:
    """The repository's default branch and how it was found: the remote's (origin/HEAD), else the one of main,
    master and trunk it has, else the checked-out branch, else ``main``."""
    def git(*argv: str) -> str | None:
        try:
            done = subprocess.run(["git", *argv], cwd=root, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None

    remote = git("symbolic-ref", "--quiet", "--short", "refs/remotes/origin/HEAD")
    if remote and "/" in remote:
        return remote.split("/", 1)[1], "the remote's default branch (origin/HEAD)"
    local = (git("for-each-ref", "--format=%(refname:short)", "refs/heads/") or "").split()
    usual = [b for b in ("main", "master", "trunk") if b in local]
    if len(usual) == 1:
        return usual[0], "the repository's only branch of main, master, trunk"
    current = git("symbolic-ref", "--quiet", "--short", "HEAD")
    if current:
        return current, "the checked-out branch (no origin/HEAD)"
    return "main", "no git branch found; --branch names it"


def _settings(root: Path, args, kept: dict) -> None:
    """Sets ``args.harness_requirement``/``branch`` (and why each): the option, else harness.toml's, else the
    default (``harness.dist.default_requirement``, ``default_branch``)."""
    from harness.ci.adopt import requirement_with
    from harness.dist import default_requirement

    def chosen(given, flag: str, key: str, lead: str, default) -> tuple[str, str]:
        if given:
            return given, flag
        if kept.get(key):
            return kept[key], _said_why(root, key, lead)
        return default()

    args.harness_requirement, args.requirement_why = chosen(
        args.harness_requirement, "--harness-requirement", "harness-requirement", "how CI installs harness: ",
        default_requirement)
    requirement_with(args.harness_requirement, ())  # a bad one: one line naming it (InvalidValue)
    args.branch, args.branch_why = chosen(args.branch, "--branch", "branch",
                                          "the branch the workflows test and benchmark: ",
                                          lambda: default_branch(root))
    if not _BRANCH.match(args.branch):
        raise InvalidValue(f"--branch must be a git branch name of letters, digits, '.', '_', '/', '-'; "
                           f"got {args.branch!r}")


def _said_why(root: Path, key: str, lead: str) -> str:
    """Why harness.toml's ``key`` has its value, as its line's comment says (harness init wrote it), else that it
    was kept from there."""
    for line in (root / "harness.toml").read_text().splitlines():
        found = re.match(rf"\s*{key}\s*=\s*\"[^\"]*\"\s*#\s*{re.escape(lead)}(?P<why>.+)$", line)
        if found:
            return found["why"].strip()
    return "kept from harness.toml"


_OPTIONS = ("devices", "ratios", "methods", "emulate", "matrix", "data", "backend")


def render(root: Path, args) -> tuple[dict[str, str], str | None]:
    """Every file ``harness init`` writes (relative path -> text), and tox.ini's ``gpu`` section.

    Without ``--model``, from the repository's harness.toml (kept as it is, but for the requirement and branch).

    Raises:
        InvalidValue: a bad option (the config is checked as ``harness.project`` will read it).
    """
    from harness.ci import adopt
    from harness.ci.matrix import load_matrix
    from harness.ci.render import render_template
    from harness.project import parse_config, read_toml_text

    config = root / "harness.toml"
    kept = read_toml_text(config.read_text(), config) if config.is_file() else {}
    if args.reusable is not None:
        adopt.parse_reusable(args.reusable)  # a bad value: one line, before anything runs
    if not args.model:
        if not kept:
            raise InvalidValue(f"harness init: --model names a workload (no harness.toml in {root} to re-render "
                               "from)")
        given = [f"--{o}" for o in _OPTIONS if getattr(args, o) not in (None, [])]
        if given:
            raise InvalidValue(f"harness init without --model re-renders from harness.toml: edit it to change "
                               f"{given[0]} (or give --model for a new configuration)")
        project = parse_config(kept, config)
        args.devices, args.methods, args.matrix = project.devices, list(project.methods), list(project.matrix)
        args.backend = project.backend
        _settings(root, args, kept)
        text = _with_settings(config.read_text(), args)
        models = {w.name: w.model for w in project.workloads}
    else:
        args.devices = 2 if args.devices is None else args.devices
        args.backend = args.backend or "tensorflow"
        args.methods = args.methods or (["towers"] if args.backend == "jax" else ["mirrored"])
        entries = adopt.matrix_entries(args.matrix or [adopt.newest_entry(load_matrix(adopt.MATRIX)).name])
        args.matrix = [e.name for e in entries]
        models = _named(args.model, "--model")
        data = _named(args.data, "--data", sole=next(iter(models)) if len(models) == 1 else None)
        strays = sorted(set(data) - set(models))
        if strays:
            raise InvalidValue(f"--data for {strays[0]!r}, which no --model names (workloads: {', '.join(models)}; "
                               "NAME=REF names one)")
        _settings(root, args, kept)
        text = config_text(models, data, args)
        if getattr(args, "measure", False):  # the generated test's own check, once, before anything is written
            expects = measure(parse_config(read_toml_text(text, config), config),
                              echo=lambda line: print(line, file=sys.stderr))
            text = config_text(models, data, args, expects)
    project = parse_config(read_toml_text(text, config), config)
    entries = adopt.matrix_entries(project.matrix)
    package = _package_name(root)
    note = f"{args.harness_requirement} ({args.requirement_why}; harness init --harness-requirement changes it)"
    files = {"harness.toml": text,
             "tests/test_harness_equivalence.py": render_template("test_harness_equivalence.py.j2"),
             "asv.conf.json": asv_config(package, adopt.newest_entry(entries), args.harness_requirement, args.branch),
             "benchmarks/__init__.py": "", "benchmarks/harness_suites.py": render_template("harness_suites.py.j2")}
    ci = adopt.ci_files(project, package, reusable=args.reusable, harness_requirement=args.harness_requirement,
                        branch=args.branch, requirement_note=note)
    gpu = ci.pop("tox.ini", None)
    files.update(ci)
    args.first_model = next(iter(models.values()))
    return files, gpu


def _merge(current: str, base: str, new: str) -> str | None:
    """``current`` (the adopter's edit of ``base``) with ``base`` -> ``new`` applied, by git's three-way merge; None
    where they overlap (or git is missing)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for name, text in (("yours", current), ("base", base), ("new", new)):
            path = Path(tmp) / name
            path.write_text(text)
            paths.append(str(path))
        try:
            done = subprocess.run(["git", "merge-file", "-p", *paths], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            return None
    return done.stdout if done.returncode == 0 else None


def _plan(root: Path, files: dict[str, str], tox_gpu: str | None, bases: dict[str, str], force: bool):
    """(path, action, text) per file, the files that stop harness init, and the edited files kept as they are."""
    plan: list[tuple[str, str, str]] = []
    conflicts: list[str] = []
    kept: list[str] = []
    for rel, text in files.items():
        path = root / rel
        current = path.read_text() if path.is_file() else None
        if not path.exists():
            plan.append((rel, "write", text))
        elif current == text:
            plan.append((rel, "unchanged", text))
        elif force:
            plan.append((rel, "replace", text))
        elif current is None or rel not in bases:  # not a file, or not harness init's: yours
            conflicts.append(rel)
            plan.append((rel, "replace", text))
        elif current == bases[rel]:  # as harness init wrote it: the new template's text
            plan.append((rel, "update", text))
        else:  # edited since harness init wrote it: the template's change merged into your edit, where they do not meet
            merged = _merge(current, bases[rel], text)
            if merged == current:
                plan.append((rel, "unchanged (your edit; its template has not changed)", text))
            elif merged is None:
                kept.append(rel)
                plan.append((rel, "keep", text))
            else:
                plan.append((rel, "merge", merged))
    if tox_gpu is not None:
        tox = root / "tox.ini"
        if not tox.exists():
            plan.append(("tox.ini", "write", tox_gpu))
        elif tox.read_text() == tox_gpu:
            plan.append(("tox.ini", "unchanged", tox_gpu))
        elif bases.get("tox.ini") == tox.read_text():
            plan.append(("tox.ini", "update", tox_gpu))
        elif "[testenv:gpu]" in tox.read_text():
            plan.append(("tox.ini", "unchanged (has a [testenv:gpu] already)", ""))
        else:
            conflicts.append("tox.ini")
            plan.append(("tox.ini", "append the gpu env to", "\n" + tox_gpu))
    return plan, conflicts, kept


def _read_bases(root: Path) -> dict[str, str]:
    path = root / MANIFEST
    if not path.is_file():
        return {}
    try:
        files = json.loads(path.read_text()).get("files", {})
    except (ValueError, AttributeError):
        raise InvalidValue(f"{path} is not harness init's record (JSON with 'files'); remove it to start over, "
                           "--force then replaces every file") from None
    return {k: v for k, v in files.items() if isinstance(k, str) and isinstance(v, str)}


_WRITES = ("write", "replace", "update", "merge")


def run(args) -> int:
    root = Path(args.dir)
    if not root.is_dir():
        raise InvalidValue(f"harness init: {root} is not a folder")
    if args.devices is not None and args.devices < 1:
        raise InvalidValue(f"--devices must be at least 1; got {args.devices}")
    bases = _read_bases(root)
    if args.dry_run:
        args.measure = False  # a preview: nothing runs
    files, tox_gpu = render(root, args)
    plan, conflicts, kept = _plan(root, files, tox_gpu, bases, args.force)
    if args.dry_run:
        for rel, action, text in plan:
            print(f"=== would {action}: {rel}" if action in (*_WRITES, "append the gpu env to")
                  else f"=== {rel}: {action}" + (" (your edit; the new text below)" if action == "keep" else ""))
            if not action.startswith("unchanged") and text:
                print(text, end="" if text.endswith("\n") else "\n")
        if conflicts and not args.force:
            print(f"harness init: {len(conflicts)} file(s) exist with other content and need --force: "
                  f"{', '.join(conflicts)}", file=sys.stderr)
        return 0
    if conflicts and not args.force:
        raise Refused("files-exist", f"these files exist with other content and harness init did not write them: "
                      f"{', '.join(conflicts)}; nothing was written (--force replaces them; --dry-run shows what "
                      "harness init writes)")
    from harness import __version__

    recorded = dict(bases)
    for rel, action, text in plan:
        path = root / rel
        if action in _WRITES:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        elif action.startswith("append"):
            with path.open("a") as handle:
                handle.write(text)
        if action != "keep" and not action.startswith("append") and not action.startswith("unchanged ("):
            recorded[rel] = files.get(rel, tox_gpu or "")  # the generated text: the next merge's base
        if action == "keep":
            print(f"harness init: kept      {rel}: you edited it since harness init wrote it, and harness "
                  f"{__version__} writes it otherwise where your edit is; not changed (--dry-run prints the new "
                  "text, --force replaces your edit)", file=sys.stderr)
        elif action == "merge":
            print(f"harness init: merged    {rel}: the template's change applied to your edit (git merge-file)",
                  file=sys.stderr)
        else:
            print(f"harness init: {action:<9} {rel}" if not action.startswith("append")
                  else f"harness init: appended the gpu env to {rel}", file=sys.stderr)
    manifest = root / MANIFEST
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({"harness": __version__, "files": recorded}, indent=1, sort_keys=True) + "\n")
    print(f"harness init: recorded  {MANIFEST} (what it wrote: a re-run merges its changes into your edits; commit "
          f"it)\nharness init: harness installed in CI as {args.harness_requirement} ({args.requirement_why}); "
          f"workflows on branch {args.branch} ({args.branch_why})", file=sys.stderr)
    backend = " --backend jax" if args.backend == "jax" else ""
    print(f"harness init: done; next: `pytest tests/test_harness_equivalence.py`, `harness check{backend} --model "
          f"{args.first_model}`, `asv run --quick` (add .asv/ to .gitignore)", file=sys.stderr)
    return 0
