"""The cluster a multi-worker run trains on: ``TF_CONFIG``, built here and read by TensorFlow.

Pure Python (no TensorFlow): the launcher (``harness launch``), the Kubernetes and Slurm
recipes (``harness tf-config``: ``from_kubernetes``, ``from_slurm``; docs/multiworker.md) and
the tests build and check ``TF_CONFIG`` with it.

``TF_CONFIG`` is TensorFlow's description of a cluster for ``MultiWorkerMirroredStrategy``:
``{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": i}}``;
worker 0 is the chief (it saves and checkpoints).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.errors import InvalidValue

__all__ = ["DEVICES_VARIABLE", "worker_slice", "tf_config", "free_ports", "parse_address", "dumps",
           "from_kubernetes", "from_slurm", "slurm_hostnames", "Cluster", "read_tf_config"]

DEVICES_VARIABLE = "HARNESS_WORKER_DEVICES"  # a worker's device count: set by harness launch, read by use_cluster


def parse_address(address: str) -> tuple[str, int]:
    """``(host, port)`` of ``"host:port"`` (``"[::1]:2222"`` for IPv6).

    Raises:
        ValueError: naming the address: no port, a port that is not an int in 1..65535, no host.
    """
    if not isinstance(address, str):
        raise InvalidValue(f"a worker address is 'host:port'; got {address!r}")
    host, sep, port = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host:
        raise InvalidValue(f"a worker address is 'host:port'; got {address!r}")
    if not port.isdecimal() or not 1 <= int(port) <= 65535:
        raise InvalidValue(f"the port of worker address {address!r} must be an int in 1..65535; got {port!r}")
    return host, int(port)


def tf_config(workers: Sequence[str], index: int) -> dict:
    """``TF_CONFIG`` of worker ``index`` in a cluster of ``workers`` (``"host:port"`` each, worker 0 the chief).

    Raises:
        ValueError: no workers, a bad address (``parse_address``), a repeated address, or ``index``
            not an int in ``0..len(workers) - 1``.

    Example:
        >>> json.dumps(tf_config(["localhost:20001", "localhost:20002"], 1))
        '{"cluster": {"worker": ["localhost:20001", "localhost:20002"]}, "task": {"type": "worker", "index": 1}}'
    """
    workers = list(workers)
    if not workers:
        raise InvalidValue("a cluster needs at least one worker; got workers=[]")
    for address in workers:
        parse_address(address)
    repeated = sorted({a for a in workers if workers.count(a) > 1})
    if repeated:
        raise InvalidValue(f"each worker needs its own address; repeated: {repeated}")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(workers):
        raise InvalidValue(f"the worker index must be an int in 0..{len(workers) - 1} ({len(workers)} workers); "
                           f"got {index!r}")
    return {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports free on ``host`` now (bound together, then released).

    Another process may take one before the worker binds it; the launcher reports
    such a worker's failure like any other.
    """
    _check_count("count", count)
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def dumps(config: dict) -> str:
    """``config`` as the ``TF_CONFIG`` environment variable's value (compact JSON)."""
    return json.dumps(config, separators=(",", ":"))


# An RFC 1123 label (what Kubernetes allows in a pod hostname and a Service name).
_DNS_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


def _env_int(environ: Mapping[str, str], name: str, hint: str) -> int:
    """``environ[name]`` as an int >= 0; a ValueError naming the variable (and ``hint``) otherwise."""
    value = environ.get(name)
    if value is None:
        raise InvalidValue(f"{name} is not set; {hint}")
    if not value.strip().isdecimal():
        raise InvalidValue(f"{name} must be an int >= 0; got {name}={value!r}")
    return int(value)


def _check_count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidValue(f"{name} must be an int >= 1; got {value!r}")
    return value


def _check_port(port: object) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise InvalidValue(f"the port must be an int in 1..65535; got {port!r}")
    return port


def from_kubernetes(environ: Mapping[str, str], *, workers: int, service: str, port: int,
                    job: str | None = None) -> dict:
    """``TF_CONFIG`` of this pod of a Kubernetes Indexed Job whose pods share a headless Service.

    An Indexed Job (``completionMode: Indexed``) names each pod's host ``<job>-<index>`` and
    sets ``JOB_COMPLETION_INDEX`` in its containers; with ``subdomain: <service>`` (a headless
    Service selecting the Job's pods) each pod resolves as ``<job>-<index>.<service>`` in the
    namespace. Worker ``i`` is therefore ``<job>-<i>.<service>:<port>`` and this pod is worker
    ``JOB_COMPLETION_INDEX`` (worker 0, the chief, is the pod of index 0).
    examples/kubernetes/indexed-job.yaml is the manifest.

    Args:
        environ: the environment (``os.environ``): ``JOB_COMPLETION_INDEX``, and ``JOB_NAME``
            when ``job`` is not given (set it from the Job's name in the manifest).
        workers: the number of workers (the Job's ``completions`` and ``parallelism``).
        service: the headless Service's name (the pod template's ``subdomain``), or a longer
            DNS name of it (``train.team.svc.cluster.local``).
        port: the port every worker listens on (the Service's and the container's port).
        job: the Job's name; ``environ["JOB_NAME"]`` when None.

    Raises:
        ValueError: naming the bad value: a missing or non-integer ``JOB_COMPLETION_INDEX``, an
            index not below ``workers``, no job name, a job or service name that is no DNS name,
            ``workers`` < 1 or a port outside 1..65535.

    Example:
        >>> from_kubernetes({"JOB_COMPLETION_INDEX": "1"}, workers=2, service="train", port=2222, job="train")
        {'cluster': {'worker': ['train-0.train:2222', 'train-1.train:2222']}, 'task': {'type': 'worker', 'index': 1}}
    """
    workers = _check_count("workers", workers)
    port = _check_port(port)
    if job is None:
        job = environ.get("JOB_NAME")
        if not job:
            raise InvalidValue("JOB_NAME is not set and no job name was given (--job): name the Indexed Job")
    if not isinstance(job, str) or not _DNS_LABEL.fullmatch(job):
        raise InvalidValue(f"the job name must be a DNS label (lower-case letters, digits and '-'); got {job!r}")
    if len(f"{job}-{workers - 1}") > 63:  # the longest pod hostname, the last worker's
        raise InvalidValue(f"the pod hostname {job}-{workers - 1} of job {job!r} is longer than a DNS label "
                           "(63 characters): shorten the job name")
    labels = service.split(".") if isinstance(service, str) else [service]
    if not all(isinstance(label, str) and _DNS_LABEL.fullmatch(label) for label in labels):
        raise InvalidValue(f"the service must be a DNS name (its labels: lower-case letters, digits and '-'); "
                           f"got {service!r}")
    index = _env_int(environ, "JOB_COMPLETION_INDEX",
                     "is this an Indexed Job's pod (spec.completionMode: Indexed)?")
    if index >= workers:
        raise InvalidValue(f"JOB_COMPLETION_INDEX={index} is not below workers={workers}: "
                           "the Job's completions must equal the number of workers")
    return tf_config([f"{job}-{i}.{service}:{port}" for i in range(workers)], index)


def slurm_hostnames(nodelist: str) -> list[str]:
    """The host names of a Slurm node list (``"gpu[01-02],big7"``), from ``scontrol show hostnames``.

    Raises:
        ValueError: naming the node list, where ``scontrol`` is missing, fails or prints nothing.
    """
    try:
        done = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                              timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise InvalidValue(f"cannot expand the node list {nodelist!r}: scontrol did not run ({err})") from err
    hosts = done.stdout.split()
    if done.returncode != 0 or not hosts:
        raise InvalidValue(f"cannot expand the node list {nodelist!r}: scontrol show hostnames exited "
                           f"{done.returncode}: {done.stderr.strip()!r}")
    return hosts


def from_slurm(environ: Mapping[str, str], *, port: int,
               hostnames: Callable[[str], list[str]] | None = None) -> dict:
    """``TF_CONFIG`` of this task of a Slurm job step that runs one task per node.

    Read inside ``srun`` (a job step): this task is worker ``SLURM_PROCID``; the workers are the
    step's nodes, ``SLURM_STEP_NODELIST`` expanded by ``scontrol show hostnames`` (or by
    ``hostnames``), in that order, each at ``<host>:<port>``; their number must equal
    ``SLURM_STEP_NUM_TASKS`` (one task per node: ``srun --ntasks-per-node=1``). Where Slurm
    sets ``SLURMD_NODENAME`` (the node this task runs on), it must be the host of this task's
    index: tasks placed out of the node list's order (``srun -m arbitrary``) are caught here
    instead of wiring the cluster wrongly.

    This is what ``tf.distribute.cluster_resolver.SlurmClusterResolver`` builds for one task
    per node, with one difference: the resolver sorts the hosts as strings (``node10`` before
    ``node9``) while ranks follow Slurm's order; here the order is Slurm's, so worker
    ``SLURM_PROCID`` is always the host that task runs on (docs/multiworker.md).

    Raises:
        ValueError: naming the variable: a missing one (not inside ``srun``?), one that is not
            an int, an index not below the number of tasks, tasks that are not one per node, a
            node that is not this task's; and a port outside 1..65535.
    """
    port = _check_port(port)
    hint = "run this inside srun (a Slurm job step)"
    index = _env_int(environ, "SLURM_PROCID", hint)
    tasks = _env_int(environ, "SLURM_STEP_NUM_TASKS", hint)
    nodelist = environ.get("SLURM_STEP_NODELIST")
    if not nodelist:
        raise InvalidValue(f"SLURM_STEP_NODELIST is not set; {hint}")
    hosts = list((hostnames or slurm_hostnames)(nodelist))
    if len(hosts) != tasks:
        raise InvalidValue(f"one task per node: SLURM_STEP_NUM_TASKS={tasks} but SLURM_STEP_NODELIST={nodelist!r} "
                           f"has {len(hosts)} nodes {hosts}; run srun --ntasks-per-node=1")
    if index >= tasks:
        raise InvalidValue(f"SLURM_PROCID={index} is not below SLURM_STEP_NUM_TASKS={tasks}")
    node = environ.get("SLURMD_NODENAME")
    if node and hosts[index] != node:
        raise InvalidValue(f"SLURMD_NODENAME={node!r} but task SLURM_PROCID={index} is host {hosts[index]!r} of "
                           f"SLURM_STEP_NODELIST={nodelist!r}: run srun --ntasks-per-node=1 with block distribution")
    return tf_config([f"{host}:{port}" for host in hosts], index)


@dataclass(frozen=True)
class Cluster:
    """This process' place in a multi-worker cluster (``harness.use_cluster``); pass it as ``devices``.

    ``devices`` lists every device of the cluster, worker by worker (worker 0's first), each
    worker's as many as ``devices_per_worker`` says: ``parallelize(model, cluster, ratios=...)``
    takes one ratio per entry. ``local_devices`` are this worker's (its towers).
    """

    index: int  # this worker; 0 is the chief (it saves and checkpoints)
    workers: int
    local_devices: tuple[str, ...]
    devices: tuple[str, ...]
    strategy: Any  # the tf.distribute.MultiWorkerMirroredStrategy over the cluster (one replica per worker)
    addresses: tuple[str, ...] = ()  # each worker's host:port (TF_CONFIG)
    devices_per_worker: tuple[int, ...] = ()  # () : one device per worker

    @property
    def is_chief(self) -> bool:
        return self.index == 0

    @property
    def counts(self) -> tuple[int, ...]:
        """Each worker's device count."""
        return self.devices_per_worker or (1,) * self.workers

    def worker_slice(self, worker: int | None = None) -> slice:
        """Where worker ``worker``'s devices (default: this worker's) sit in ``devices`` (and in the ratios)."""
        return worker_slice(self.counts, self.index if worker is None else worker)


def worker_slice(counts: Sequence[int], worker: int) -> slice:
    """Where worker ``worker``'s devices sit in a list of every worker's, worker 0's first (``counts`` each)."""
    start = sum(counts[:worker])
    return slice(start, start + counts[worker])


def read_tf_config(environ: Mapping[str, str] | None = None) -> dict:
    """The ``TF_CONFIG`` of this process, checked: a worker cluster and this worker's index in it.

    Raises:
        ValueError: naming what is wrong: no ``TF_CONFIG``, not JSON, no workers, a task that is not a
            worker or whose index is out of range.
    """
    environ = os.environ if environ is None else environ
    text = environ.get("TF_CONFIG")
    if not text:
        raise InvalidValue("TF_CONFIG is not set: start the workers with `harness launch --workers N -- ...` "
                           "(or the Kubernetes/Slurm recipes, docs/multiworker.md), which set it for each worker")
    try:
        config = json.loads(text)
    except json.JSONDecodeError as err:
        raise InvalidValue(f"TF_CONFIG is not JSON ({err}): {text!r}") from None
    workers = (config.get("cluster") or {}).get("worker") if isinstance(config, dict) else None
    task = config.get("task") if isinstance(config, dict) else None
    if not isinstance(workers, list) or not workers:
        raise InvalidValue(f"TF_CONFIG names no workers (cluster.worker): {text!r}")
    if not isinstance(task, dict) or task.get("type") != "worker":
        raise InvalidValue(f"TF_CONFIG's task must be a worker (harness clusters have workers only): {text!r}")
    index = task.get("index")
    if isinstance(index, bool) or not isinstance(index, int):
        raise InvalidValue(f"TF_CONFIG's task index must be an int; got {index!r}: {text!r}")
    return tf_config(workers, index)  # checks the addresses and the index
