"""``harness docker``: build a version-matrix image for real, smoke-test it, run the fast suite inside.

Drives the engine through the Docker SDK for Python (``pip install 'keras-harness[ci]'``):
the one ``DOCKER_HOST`` names, else the default socket. Only the build goes through
the ``docker`` command line (BuildKit, which the SDK lacks). Where no engine answers
and this is root, starts a private dockerd (overlay2 storage, else vfs; no iptables; own socket and
data root under ``--work-dir``) and stops it afterwards. Its data root stays: the next run builds
from its layer cache (the dependencies' layer is reused while they are unchanged; the cache is
pruned to 10 GB), as a long-running engine's cache serves builds; ``--no-cache`` builds from
nothing and deletes it. Each call to the engine may
take ``HARNESS_DOCKER_TIMEOUT`` seconds (default 300: a vfs engine copies the whole image to
create a container); one that takes longer fails naming the engine and the timeout.
Where no registry answers, the Debian base is built with debootstrap. By default
every package comes from a wheelhouse filled on the host (``--offline``, the
mode for air-gapped runners); ``--online`` lets pip inside the build use the index.

An entry without TensorFlow (``jax011``: Keras 3 on JAX, Python 3.12 on Ubuntu 24.04) runs what its tox env
runs, tests/onjax and tests/unit/test_device_check.py, instead of the TensorFlow suite; its Ubuntu base must
be in the engine or come from a registry (debootstrap builds the Debian base only), and an offline wheelhouse
needs a host Python 3.12 (``--online`` otherwise).

Examples:
    harness docker test                     # tf221 CPU image: build, `harness env`, fast suite inside
    harness docker test --entry legacy      # TF 2.21 + tf-keras (Keras 2)
    harness docker build --entry tf215 --keep-image
    harness docker test --entry jax011      # Keras 3 on JAX 0.11, no TensorFlow: tests/onjax inside
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path

from harness.ci import containers
from harness.ci.matrix import build_args, default_path, image_tag, load_matrix, newest
from harness.errors import Failed, InvalidValue, Unavailable

__all__ = ["add_parser", "run"]

_SKIPS_MARK = "=== harness docker: the skip report of the suite ==="
_SUITE_CMD = ("mkdir -p ~/src && tar -C /src --exclude=./.venv --exclude=./.tox --exclude=./.asv "
              "--exclude=./.hypothesis --exclude=./docker/wheelhouse -cf - . | tar -C ~/src -xf - && cd ~/src && "
              "python -m pytest -p no:cacheprovider -q -n {workers} -m 'not docker and not gpu' "
              "--skip-report ~/skips.jsonl {paths}{extra}; status=$?; echo '" + _SKIPS_MARK + "'; "
              "cat ~/skips.jsonl 2>/dev/null; exit $status")
# What an image without TensorFlow runs (the TensorFlow suite cannot even be collected there): the tests of
# tox.ini's [testenv:jax011] (tests/unit/test_matrix.py keeps the two the same).
NO_TF_PATHS = ("tests/onjax", "tests/unit/test_device_check.py")


def suite_paths(entry) -> tuple[str, ...]:
    """The test paths ``harness docker test`` runs in ``entry``'s image: the whole tree (``()``) where it has
    TensorFlow, else ``NO_TF_PATHS``; ``--pytest-args`` paths are added to them."""
    return () if entry.has_tensorflow else NO_TF_PATHS


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("docker", help="build a matrix image, smoke-test it, run the suite inside",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["build", "test"], help="build: image + `harness env`; test: also the suite")
    p.add_argument("--entry", default=None, help="docker/matrix.toml entry (default: the newest)")
    p.add_argument("--variant", choices=["cpu", "gpu"], default="cpu", help="image variant (default cpu)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--offline", dest="offline", action="store_true", default=True,
                      help="install only from a host-filled wheelhouse (default)")
    mode.add_argument("--online", dest="offline", action="store_false", help="let pip in the build use the index")
    p.add_argument("--work-dir", default=None,
                   help="engine root, build context and base cache (default ~/.cache/harness/docker)")
    p.add_argument("--keep-image", action="store_true", help="leave the image in the engine")
    p.add_argument("--keep-engine", action="store_true", help="leave a private engine running (prints DOCKER_HOST)")
    p.add_argument("--no-pull", action="store_true", help="never try a registry for the Debian base")
    p.add_argument("--no-cache", action="store_true",
                   help="build every layer anew, and keep no private engine's data root (images, layer cache)")
    p.add_argument("--workers", type=int, default=2, help="pytest-xdist workers in the container (default 2)")
    p.add_argument("--pytest-args", default="", help="extra pytest arguments, one string")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON here")
    p.add_argument("--skip-report", metavar="PATH",
                   help="write the suite's skips here (pytest --skip-report's lines, declared context 'image'; "
                        "scripts/check-skips reads them)")
    p.set_defaults(run=run)


def _log(line: str) -> None:
    print(f"  | {line}", file=sys.stderr, flush=True)


def _say(line: str) -> None:
    print(f"harness docker: {line}", file=sys.stderr, flush=True)


def run(args) -> int:
    entries = load_matrix()
    by_name = {e.name: e for e in entries}
    entry = newest(entries) if args.entry is None else by_name.get(args.entry)
    if entry is None:
        raise InvalidValue(f"--entry must be one of {sorted(by_name)}; got {args.entry!r}")
    if args.workers < 1:
        raise InvalidValue(f"--workers must be >= 1; got {args.workers}")
    repo = default_path().parent.parent
    if not (repo / "docker" / "Dockerfile").exists():
        raise Unavailable(f"harness docker needs a checkout with docker/Dockerfile; {repo} has none")
    work = Path(args.work_dir or Path.home() / ".cache" / "harness" / "docker").resolve()
    tag = image_tag(entry, args.variant)
    report: dict = {"entry": entry.name, "variant": args.variant, "tag": tag, "offline": args.offline,
                    "backend": entry.backend, "framework": entry.framework,
                    "tensorflow": entry.tensorflow or None, "jax": entry.jax or None,
                    "keras": entry.keras, "python": entry.python}
    wall = time.perf_counter()
    # SIGTERM (a CI job cancelled, `timeout`) unwinds like Ctrl-C, so the finally below stops a
    # private engine and removes the image instead of leaving them behind.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _run(args, entry, tag, repo, work, report, wall)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _run(args, entry, tag, repo, work, report, wall) -> int:
    engine = containers.find_engine()
    if engine is None:
        _say("no engine answers; starting a private one")
        engine = containers.start_engine(work / "engine", _log, keep_data=not args.no_cache)
    report["engine_started"] = engine.started
    report["storage"] = engine.driver
    try:
        version = containers.engine_version(engine)
        report["engine_version"] = version["version"]
        _say(f"engine: Docker {version['version']} (API {version['api_version']}, {version['os']}/{version['arch']})"
             f" at {engine.address}")
        _build_and_check(args, engine, entry, tag, repo, work, report)
    finally:
        if not args.keep_image:
            try:
                containers.remove_image(engine, tag)
            except RuntimeError as err:  # say so, without hiding what is already on its way out
                _say(f"warning: {err}")
        if args.keep_engine and engine.started:
            _say(f"engine left running: export DOCKER_HOST={engine.host}")
        else:
            engine.stop()
    report["wall_s"] = round(time.perf_counter() - wall, 1)
    _print_report(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report.get("tests_rc", 0) == 0 else 1


def _build_and_check(args, engine, entry, tag, repo, work, report) -> None:
    context = work / f"context-{entry.name}-{args.variant}"
    context.mkdir(parents=True, exist_ok=True)
    shutil.copy(repo / "docker" / "Dockerfile", context / "Dockerfile")
    _say(f"wheelhouse ({'offline: every package' if args.offline else 'online: the harness wheel only'})")
    start = time.perf_counter()
    containers.fill_wheelhouse(context / "wheelhouse", entry, args.variant, repo, args.offline, _log)
    report["wheelhouse_s"] = round(time.perf_counter() - start, 1)
    report["wheelhouse_bytes"] = sum(f.stat().st_size for folder in ("wheelhouse", "deps")
                                     for f in (context / folder).glob("*.whl"))
    bargs = build_args(entry, args.variant)
    if args.variant == "cpu":
        bargs["BASE_IMAGE"] = containers.ensure_cpu_base(engine, work, bargs["BASE_IMAGE"], _log,
                                                         pull=not args.no_pull)
    bargs["OFFLINE"] = "1" if args.offline else "0"
    report["base"] = bargs["BASE_IMAGE"]
    _say(f"building {tag} on {bargs['BASE_IMAGE']}")
    steps: dict[str, bool] = {}

    def build_log(line: str) -> None:  # counts the build's steps, and those the layer cache gave
        step = re.match(r"#(\d+) \[\s*\d+/\d+\]", line)
        if step:
            steps.setdefault(step.group(1), False)
        cached = re.match(r"#(\d+) CACHED$", line)
        if cached and cached.group(1) in steps:
            steps[cached.group(1)] = True
        _log(line)

    report["build_s"] = round(containers.build_image(engine, context / "Dockerfile", context, tag, bargs, build_log,
                                                     no_cache=args.no_cache), 1)
    report["build_steps"], report["build_steps_cached"] = len(steps), sum(steps.values())
    if engine.started and not args.no_cache:
        containers.prune_build_cache(engine, log=_log)
    report.update(containers.image_facts(engine, tag))
    _say(f"smoke: harness env in {tag}")
    code, lines, seconds = containers.run_in_image(engine, tag, ["harness", "env"], gpus=args.variant == "gpu",
                                                   log=_log, timeout=300)
    report.update(env_rc=code, env_output="\n".join(lines), env_s=round(seconds, 1))
    if code != 0:
        raise Failed(f"`harness env` failed in {tag} (exit {code})")
    if args.action == "test":
        paths = "".join(f"{path} " for path in suite_paths(entry))
        command = _SUITE_CMD.format(workers=args.workers, paths=paths, extra=args.pytest_args)
        _say(f"fast suite in {tag}: {command.split('&& ')[-1]}")
        # The skips' context: what the image lacks by design (the linters; tf-keras beside Keras 3) is allowed there.
        context = "image" + (" keras2" if entry.keras_major == 2 else "")
        env_pairs = [f"{k}={v}" for k, v in entry.env.items()] + [f"HARNESS_SKIP_CONTEXT={context}"]
        code, lines, seconds = containers.run_in_image(
            engine, tag, ["env", *env_pairs, "bash", "-c", command], mount=repo, gpus=args.variant == "gpu",
            log=_log, timeout=3600)
        mark = lines.index(_SKIPS_MARK) if _SKIPS_MARK in lines else len(lines)
        lines, skips = lines[:mark], [ln for ln in lines[mark + 1:] if ln.startswith("{")]
        summary = next((ln for ln in reversed(lines) if " in " in ln and ("passed" in ln or "failed" in ln)), "")
        report.update(tests_rc=code, tests_s=round(seconds, 1), tests_summary=summary.strip("= "), skips=len(skips))
        if args.skip_report:
            Path(args.skip_report).write_text("".join(line + "\n" for line in skips))


def _print_report(report: dict) -> None:
    size = report.get("size_bytes")
    rows = [("image", f"{report['tag']} (entry {report['entry']}, {report['variant']}, "
                      f"{'offline wheelhouse' if report['offline'] else 'online'})"),
            ("versions", f"{report['framework']}, Keras {report['keras']}, Python {report['python']}"),
            ("base", report.get("base", "?")),
            ("engine", f"{'private dockerd' if report.get('engine_started') else 'existing engine'}"
                       f"{' (' + report['storage'] + ' storage)' if report.get('storage') else ''}, Docker "
                       f"{report.get('engine_version', '?')}"
                       f"{' (started and stopped here)' if report.get('engine_started') else ''}"),
            ("image size", f"{size / 2**30:.2f} GiB ({size:,} bytes)" if size else "?"),
            ("user", report.get("user") or "root"),
            ("wheelhouse", f"{report.get('wheelhouse_bytes', 0) / 2**20:.0f} MiB in {report.get('wheelhouse_s')} s"),
            ("build", f"{report.get('build_s')} s ({report.get('build_steps_cached', '?')} of "
                      f"{report.get('build_steps', '?')} steps from the layer cache)"),
            ("tests", f"{report.get('tests_summary') or '-'} ({report.get('tests_s', '-')} s in the container)"),
            ("total", f"{report.get('wall_s')} s")]
    print("\n".join(f"{k:<11} {v}" for k, v in rows))
    if report.get("env_output"):
        print("\nharness env (inside the container):\n" + report["env_output"])
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a") as out:
            out.write("\n".join(f"- **{k}**: {v}" for k, v in rows) + "\n")
