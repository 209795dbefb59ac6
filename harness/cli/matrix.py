"""``harness matrix``: the test suites over the version matrix's tox envs, as a compatibility table.

Runs ``tox -e ENV -- --junitxml=...`` for each env (default: every docker/matrix.toml entry;
installs are large, pip's cache is reused), or reads JUnit files you already have, and writes
the table (env x suite -> pass/fail/skip with counts and versions) as Markdown and JSON.

Examples:
    harness matrix --envs tf221,legacy,tf215 --suites upstream
    harness matrix --from-junit results/matrix/*.xml --markdown docs/compatibility.md
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

from harness.errors import InvalidValue

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("matrix", help="run the suites over the tox envs; write the compatibility table",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envs", help="comma-separated tox envs (default: every matrix entry with TensorFlow)")
    p.add_argument("--suites", default="unit,parallel,upstream",
                   help="comma-separated folders under tests/ (default unit,parallel,upstream)")
    p.add_argument("--from-junit", nargs="+", metavar="XML", help="build the table from these files; run nothing")
    p.add_argument("--out", default="results/matrix", help="JUnit files and the table go here (default %(default)s)")
    p.add_argument("--markdown", metavar="PATH", help="also write the Markdown table here")
    p.add_argument("--pytest-args", default="", help="extra pytest arguments, one string")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per env (default 3600)")
    p.set_defaults(run=run)


def run(args) -> int:
    from harness.ci import compat_report
    from harness.ci.matrix import default_path, load_matrix

    out = Path(args.out)
    if args.from_junit:
        results = [compat_report.read_junit(path) for path in args.from_junit]
    else:
        entries = load_matrix()
        known = [e.name for e in entries]
        # An entry without TensorFlow (Keras 3 on JAX) runs only tests/onjax: named, never a default
        envs = args.envs.split(",") if args.envs else [e.name for e in entries if e.has_tensorflow]
        unknown = [e for e in envs if e not in known and e not in ("py", "gpu")]
        if unknown:
            raise InvalidValue(f"--envs must name matrix tox envs {known}; got {unknown}")
        repo = default_path().parent.parent
        suites = [s.strip() for s in args.suites.split(",") if s.strip()]
        missing = [s for s in suites if not (repo / "tests" / s).is_dir()]
        if missing or not suites:
            raise InvalidValue(f"--suites must name folders under tests/; got {missing or suites}")
        without_tf = [e.name for e in entries if not e.has_tensorflow and e.name in envs]
        if without_tf and set(suites) - {"onjax"}:
            raise InvalidValue(f"--envs {','.join(without_tf)} has no TensorFlow: its suite is onjax alone "
                               f"(--suites onjax); got --suites {','.join(suites)}")
        out.mkdir(parents=True, exist_ok=True)
        results = [_run_env(env, i, len(envs), suites, repo, out, args) for i, env in enumerate(envs, 1)]
    out.mkdir(parents=True, exist_ok=True)
    table = compat_report.markdown_table(results)
    (out / "compatibility.md").write_text(table)
    (out / "compatibility.json").write_text(compat_report.to_json(results) + "\n")
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text("# Compatibility\n\n" + table)
    print(table)
    print(f"written: {out / 'compatibility.md'}, {out / 'compatibility.json'}", file=sys.stderr)
    failed = any(r.error or any(c.state == "fail" for c in r.cells.values()) for r in results)
    return 1 if failed else 0


def _tox() -> list[str]:
    found = shutil.which("tox")
    return [found] if found else [sys.executable, "-m", "tox"]


def _run_env(env, i, total, suites, repo, out, args):
    from harness.ci import compat_report

    junit = (out / f"{env}.xml").resolve()
    junit.unlink(missing_ok=True)
    cmd = [*_tox(), "-e", env, "--", "-p", "no:cacheprovider", f"--junitxml={junit}",
           *[f"tests/{s}" for s in suites], *args.pytest_args.split()]
    print(f"[{i}/{total}] {env}: {' '.join(cmd[len(_tox()):])}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=args.timeout)
        tail = proc.stdout.strip().splitlines()[-1:] or [""]
        (out / f"{env}.log").write_text(proc.stdout + proc.stderr)
    except subprocess.TimeoutExpired:
        return compat_report.EnvResult(env, {}, {}, error=f"timed out after {args.timeout:.0f} s")
    took = time.perf_counter() - start
    print(f"[{i}/{total}] {env}: exit {proc.returncode} in {took:.0f} s  {tail[0]}", file=sys.stderr, flush=True)
    if not junit.exists():
        return compat_report.EnvResult(env, {}, {}, seconds=took,
                                       error=f"no test results (exit {proc.returncode}); see {out / (env + '.log')}")
    result = compat_report.read_junit(junit, env)
    result.seconds = round(took, 1)
    return result
