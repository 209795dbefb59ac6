"""What ``harness run``, ``compare``, ``tune`` and ``calibrate`` share on the console: running a configuration with
live progress and its record rewritten after each window (``execute``, ``execute_cluster``), the per-window and
summary text, and ``Output`` (printing, progress and the result record of one invocation).

``Output`` takes the command's options (an ``argparse.Namespace`` or anything with ``json``, ``no_save`` and
``results_dir``); ``setup`` is the command's device set-up (``harness.cli.options.DeviceSetup``: ``kind``,
``devices``). Nothing here parses options.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

__all__ = ["Output", "execute", "execute_cluster", "window_text", "summary_text", "warn_host_bound", "telemetry_for"]


def telemetry_for(setup):
    """A started NVML sampler for the GPU devices of ``setup`` (``harness.cli.options.DeviceSetup``: its ``kind`` and
    ``devices``), else None."""
    if setup.kind != "GPU":
        return None
    from harness.bench.nvml import TelemetrySampler
    from harness.bench.runner import gpu_index

    return TelemetrySampler([i for i in (gpu_index(d) for d in setup.devices) if i is not None]).start()


def execute_cluster(plan, config, out, prefix: str = "", compact: bool = False) -> dict:
    """Runs ``plan`` across its workers (``harness.bench.cluster_run``), printing each merged window and
    rewriting the record after each; returns the run's result (``cluster_result``)."""
    from harness.bench.cluster_run import cluster_result, launch_run

    windows: list[dict] = []
    chief: dict = {}  # the chief's start event: its config and environment
    partial = out.record.setdefault("partial", [])

    def on_event(worker: int, event: dict) -> None:
        if event["event"] == "start" and worker == 0:
            chief.update(event)
            out.record["environment"] = event.get("environment") or out.record["environment"]
            if "run" in out.record["config"]:  # harness run's record (compare keeps its rows' configs)
                out.record["config"]["run"] = event.get("config") or out.record["config"]["run"]

    def on_window(merged: dict) -> None:
        windows.append(merged)
        partial.append(merged)
        out.say(window_text(merged, config.windows, prefix, compact))
        out.save()

    launched, ends, problems = launch_run(plan, on_event=on_event, on_window=on_window)
    result = cluster_result(plan, windows, ends, launched.status, launched.first_failure, launched.reason,
                            config=chief.get("config") or config.to_json())
    if problems and result["status"] == "complete":
        result.update(status="failed", error=problems[0])
    out.record.pop("partial", None)
    return result


def warn_host_bound(result: dict) -> None:
    """One warning line on stderr when the run's emulated devices were host-bound."""
    from harness.bench.runner import host_bound
    from harness.emulate import host_bound_text

    if host_bound(result):
        print(f"harness run: warning: {host_bound_text(host_bound(result))}", file=sys.stderr)


def execute(config, setup, out, prefix: str = "", compact: bool = False, run=None) -> dict:
    """Runs ``config`` with progress and a record rewritten after each window: with ``harness.bench.runner.run_one``
    and the devices' telemetry (``setup``), or with ``run`` (``harness.bench.jaxbench.run_one``: no telemetry)."""
    if run is None:
        from harness.bench.runner import run_one

        telemetry = telemetry_for(setup)
        run = functools.partial(run_one, telemetry=telemetry)
    else:
        telemetry = None
    partial = out.record.setdefault("partial", [])

    def on_window(window):
        partial.append(window)
        out.clear_progress()
        out.say(window_text(window, config.windows, prefix, compact))
        out.save()

    try:
        return run(config, on_window=on_window, on_step=out.progress(prefix, config.windows))
    finally:
        out.clear_progress()
        out.record.pop("partial", None)
        if telemetry is not None:
            telemetry.stop()


def window_text(window: dict, windows: int, prefix: str = "", compact: bool = False) -> str:
    """One window as a per-device table (as seed 000 prints it), or as one line."""
    from harness.bench.report import format_table
    from harness.bench.runner import SOURCES

    head = (f"{prefix}window {window['index'] + 1}/{windows}: {window['steps']} steps, {window['seconds']:.2f} s, "
            f"{window['samples_per_second']:.0f} samples/s")
    devices = window["devices"]
    if compact:
        return head + " (" + ", ".join(
            f"{d['device'].split('/')[-1].removeprefix('device:')} {d['samples_per_second']:.0f}"
            + ("" if d.get("busy_fraction") is None else f" at {100 * d['busy_fraction']:.0f}% busy")
            + ("" if d.get("link_fraction") is None else f", {100 * d['link_fraction']:.0f}% on its link")
            + (f", HOST-BOUND: late {d['late_steps']}/{d['logged_steps']}, host {d['host_rate']:.0f}"
               if d.get("host_bound") else "")
            for d in devices) + ")"
    has_busy = any("busy_fraction" in d for d in devices)
    has_host = any("late_steps" in d for d in devices)
    has_gpu = any(d.get("telemetry") for d in devices)
    has_link = any("link" in d for d in devices)
    headers = ["device", "batch", "samples/s"] + (["busy", "busy sps"] if has_busy else [])
    headers += ["late", "host sps"] if has_host else []
    headers += ["link", "MB/step", "on link"] if has_link else []
    headers += ["GPU util", "GPU mem", "power", "temp", "SM clock"] if has_gpu else []
    rows = []
    for d in devices:
        row = [d["device"], d["batch"], f"{d['samples_per_second']:.0f}"]
        if has_busy:
            row += [_fmt(d.get("busy_fraction"), "{:.0%}"), _fmt(d.get("busy_rate"), "{:.0f}")]
        if has_host:
            row += ["-" if "late_steps" not in d else f"{d['late_steps']}/{d['logged_steps']}",
                    _fmt(d.get("host_rate"), "{:.0f}")]
        if has_link:
            link = d.get("link")
            row += ["-" if link is None else (link["name"] or f"{link['gb_per_s']:g} GB/s"),
                    _fmt(None if d.get("moved_bytes_per_step") is None else d["moved_bytes_per_step"] / 1e6, "{:.2f}"),
                    _fmt(d.get("link_fraction"), "{:.0%}")]
        if has_gpu:
            tel = d.get("telemetry") or {}
            row += [_fmt(_mean(tel, "utilization_pct"), "{:.0f}%"), _fmt(_max(tel, "memory_used_mib"), "{:.0f} MiB"),
                    _fmt(_mean(tel, "power_w"), "{:.0f} W"), _fmt(_max(tel, "temperature_c"), "{:.0f} C"),
                    _fmt(_mean(tel, "sm_clock_mhz"), "{:.0f} MHz")]
        rows.append(row + [d["source"] + (" HOST-BOUND" if d.get("host_bound") else "")])
    rows.append(["total", sum(d["batch"] for d in devices), f"{window['samples_per_second']:.0f}"]
                + [""] * (len(headers) - 3) + [""])
    table = format_table(rows, headers + ["how"])
    legend = "\n".join(f"   how: {s} = {SOURCES[s]}" for s in sorted({d["source"] for d in devices}))
    if has_host:
        legend += ("\n   late: steps whose real work ran past the emulated deadline; host sps: the rate this host "
                   "computed the slices at")
    if has_link:
        legend += ("\n   link: the emulated device's link; MB/step: what a step moved over it (slice and weights in, "
                   "gradients and outputs out); on link: the share of its busy time charged for that")
    return (head + "\n" + "\n".join("   " + line for line in table.splitlines()) + "\n" + legend
            + _resplit_text(window) + _workers_text(window))


def _workers_text(window: dict) -> str:
    """Across workers: each worker's rows per step and samples/s (rows per step over its step time)."""
    if not window.get("workers"):
        return ""
    return "\n   per worker: " + "; ".join(
        f"worker {w['worker']} batch {w['batch']}, {w['samples_per_second']:.0f} samples/s "
        f"(step {1000 * w['step_seconds']:.1f} ms)" for w in window["workers"])


def _resplit_text(window: dict) -> str:
    """The rebalancer's re-splits during a window, one line each."""
    from harness.parallel.resplit import describe

    return "".join(f"\n   {describe(entry)}" for entry in window.get("resplits") or ())


def _fmt(value, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def _mean(telemetry: dict, field: str):
    return (telemetry.get(field) or {}).get("mean")


def _max(telemetry: dict, field: str):
    return (telemetry.get(field) or {}).get("max")


def summary_text(result: dict, setup) -> str:
    from harness.bench.runner import host_bound

    s = result["summary"]["samples_per_second"]
    kind = "" if setup.kind != "emulated" else (" [emulated devices, HOST-BOUND: see the warning]" if host_bound(result)
                                                else " [emulated devices]")
    spread = "n/a" if s["spread"] is None else f"{100 * s['spread']:.1f}%"
    text = f"median {s['median']:.0f} samples/s over {s['n']} windows (spread {spread}){kind}"
    if result.get("workers"):
        text += "\nper worker (median): " + ", ".join(
            f"worker {w['worker']} {w['samples_per_second']['median']:.0f} samples/s" for w in result["workers"]
            if w.get("samples_per_second"))
    inp = result.get("input")
    if inp:
        text += f"\ninput pipeline alone: {inp['samples_per_second']:.0f} samples/s"
        if inp["starved"]:
            text += " -- STARVED: the input pipeline cannot feed training; more devices will not help"
    return text


class Output:
    """Printing, live progress and the result record of one CLI invocation."""

    def __init__(self, args, kind: str, config: dict, environment: dict | None = None):
        from harness.bench.environment import fingerprint
        from harness.bench.results import new_record

        self.args = args
        self.record = new_record(kind, config, fingerprint(import_tf=True) if environment is None else environment)
        self.path: Path | None = None  # where the record was saved, once it was
        self._live = sys.stderr.isatty() and not args.json
        self._dirty = False

    def guard(self, work):
        """``work()``; if it raises (Ctrl-C included), the record is saved as failed first."""
        try:
            return work()
        except BaseException as err:
            self.finish(status="failed", error=f"{type(err).__name__}: {err}".splitlines()[0])
            raise

    def finish(self, **fields) -> None:
        from datetime import datetime, timezone

        self.record.update(fields, finished=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        self.save()
        if self.path is not None:
            self.say(f"record: {self.path}")

    def say(self, text: str) -> None:
        if not self.args.json:
            print(text, flush=True)

    def save(self) -> None:
        if self.args.no_save:
            return
        from harness.bench.results import write_record

        self.path = write_record(self.record, self.args.results_dir)

    def progress(self, prefix: str, windows: int):
        def on_step(phase, steps, elapsed):
            if not self._live:
                return
            where = "warm-up" if phase == "warmup" else f"window {phase + 1}/{windows}"
            sys.stderr.write(f"\r{prefix}{where}: step {steps}, {elapsed:.1f} s   ")
            sys.stderr.flush()
            self._dirty = True

        return on_step

    def clear_progress(self) -> None:
        if self._dirty:
            sys.stderr.write("\r" + " " * 60 + "\r")
            sys.stderr.flush()
            self._dirty = False
