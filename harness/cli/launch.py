"""``harness launch``: run one command as N local workers of a loopback TensorFlow cluster.

Each worker gets ``TF_CONFIG`` naming all of them on free 127.0.0.1 ports (worker 0 is the
chief), ``HARNESS_WORKER_INDEX`` and ``HARNESS_WORKERS``; their output lines come prefixed
``[worker i]``. The launch exits 0 when every worker does, else with the first failing
worker's status (128 + N when a signal N killed it), after stopping the others; 124 on
``--timeout``, 130 on Ctrl-C or SIGTERM. No worker process (nor anything it started) is left
running.

Examples:
    harness launch --workers 2 -- python train.py
    harness launch --workers 3 --timeout 600 -- harness check
    harness launch --workers 2 --devices-per-worker 1 2 -- harness check   # 1 device, then 2
"""

from __future__ import annotations

import argparse
import signal

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> None:
    """Registers ``launch`` on the ``harness`` subcommand parsers."""
    p = subparsers.add_parser("launch", help="run a command as N local workers of one TF_CONFIG cluster",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, required=True, metavar="N", help="worker processes to start (>= 1)")
    p.add_argument("--devices-per-worker", type=int, nargs="+", metavar="N",
                   help="devices each worker trains on (harness.use_cluster: logical CPUs without a GPU, else "
                        "its first N GPUs): one N for all, or one per worker")
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="stop every worker after S seconds (exit 124; default: no limit)")
    p.add_argument("--grace", type=float, default=5.0, metavar="S",
                   help="seconds between SIGTERM and SIGKILL when stopping workers (default 5)")
    p.add_argument("--keep-going", action="store_true",
                   help="after a worker fails, let the others end on their own (default: stop them at once)")
    p.add_argument("--host", default="127.0.0.1", help="the address the workers listen on (default 127.0.0.1)")
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="COMMAND",
                   help="-- then the command each worker runs (its program and arguments)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Launches the workers; returns the launch's exit status."""
    from harness.launch import launch

    command = list(args.argv)
    if command[:1] == ["--"]:
        command = command[1:]

    def stop(signum, frame):  # a cancelled CI job: stop the workers as Ctrl-C does
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        result = launch(command, args.workers, host=args.host, devices_per_worker=args.devices_per_worker,
                        timeout_s=args.timeout, grace_s=args.grace,
                        stop_on_failure=not args.keep_going)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return result.status
