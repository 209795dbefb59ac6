"""``harness tf-config``: print this process's ``TF_CONFIG`` on a Kubernetes or Slurm cluster.

``TF_CONFIG`` tells ``tf.distribute.MultiWorkerMirroredStrategy`` the workers' addresses and
which one this process is (worker 0 is the chief). Each worker runs this command before its
training script and exports the result (examples/kubernetes/indexed-job.yaml,
examples/slurm/train.sbatch, docs/multiworker.md):

    export TF_CONFIG="$(harness tf-config kubernetes --workers 2 --service train --port 2222 --job train)"
    python train.py

Kubernetes (an Indexed Job with a headless Service as its pods' subdomain): worker i is
``<job>-<i>.<service>:<port>``; this pod is worker ``$JOB_COMPLETION_INDEX``; the job name is
``--job`` or ``$JOB_NAME``.

Slurm (inside ``srun``, one task per node): the workers are the step's nodes
(``$SLURM_STEP_NODELIST`` through ``scontrol show hostnames``) at ``--port``; this task is
worker ``$SLURM_PROCID``.

Examples:
    harness tf-config kubernetes --workers 2 --service train --port 2222 --job train
    harness tf-config slurm --port 29500
"""

from __future__ import annotations

import argparse
import os

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> None:
    """Registers ``tf-config`` (with ``kubernetes`` and ``slurm``) on the ``harness`` subcommand parsers."""
    p = subparsers.add_parser(
        "tf-config",
        help="print this worker's TF_CONFIG on a Kubernetes Indexed Job or in a Slurm job step",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = p.add_subparsers(dest="cluster", metavar="CLUSTER", required=True)
    k8s = where.add_parser(
        "kubernetes",
        help="an Indexed Job's pod: worker $JOB_COMPLETION_INDEX of <job>-<i>.<service>:<port>",
        description="TF_CONFIG of this pod of a Kubernetes Indexed Job (completionMode: Indexed) whose pod "
        "template's subdomain is a headless Service: worker i is <job>-<i>.<service>:<port>, this pod is "
        "worker $JOB_COMPLETION_INDEX.",
    )
    k8s.add_argument("--workers", type=int, required=True,
                     help="number of workers: the Job's completions and parallelism")
    k8s.add_argument("--service", required=True, help="the headless Service (the pod template's subdomain)")
    k8s.add_argument("--port", type=int, required=True, help="the port every worker listens on")
    k8s.add_argument("--job", default=None, help="the Job's name (default: $JOB_NAME)")
    slurm = where.add_parser(
        "slurm",
        help="a task of srun, one per node: worker $SLURM_PROCID of the step's nodes",
        description="TF_CONFIG of this task of a Slurm job step with one task per node (run inside srun): "
        "the workers are $SLURM_STEP_NODELIST expanded by scontrol show hostnames, each at --port; this task "
        "is worker $SLURM_PROCID.",
    )
    slurm.add_argument("--port", type=int, required=True, help="the port every worker listens on")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Prints the ``TF_CONFIG`` JSON (one line); returns 0. A bad environment raises ValueError."""
    from harness.cluster import dumps, from_kubernetes, from_slurm

    if args.cluster == "kubernetes":
        config = from_kubernetes(os.environ, workers=args.workers, service=args.service, port=args.port,
                                 job=args.job)
    else:
        config = from_slurm(os.environ, port=args.port)
    print(dumps(config))
    return 0
