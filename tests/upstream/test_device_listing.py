"""Counting and describing GPUs starts no TensorFlow and takes no GPU memory.

Guards: seed 003, tip 5 (docs/background.md: listing devices through TensorFlow creates a context
that grabs memory on every GPU); the harness's own rule that `import harness` and `harness --help`
never import TensorFlow.
"""

import json
import os
import subprocess
import sys

import pytest

CHILD = """
import json, os, sys
import harness
from harness.bench import nvml
from harness.bench.environment import fingerprint
from harness.devices import gpu_count
count = gpu_count()
gpus = nvml.gpus()
env = fingerprint(import_tf=False)
print(json.dumps({"count": count, "nvml": len(gpus), "tf_loaded": "tensorflow" in sys.modules,
                  "keras_loaded": "keras" in sys.modules, "pid": os.getpid()}))
"""


def _child(extra: str = "") -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD + extra], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_counting_gpus_imports_neither_tensorflow_nor_keras():
    facts = _child()
    assert facts["tf_loaded"] is False and facts["keras_loaded"] is False
    assert facts["count"] >= 0


def test_the_child_check_can_fail():
    # the guard, shown failing: a child that does touch TensorFlow is reported as such
    pytest.importorskip("tensorflow")
    assert _child("import tensorflow\nprint(json.dumps({'tf_loaded': 'tensorflow' in sys.modules}))")["tf_loaded"]


@pytest.mark.gpu
def test_counting_gpus_allocates_no_gpu_memory():
    import pynvml  # the test reads the driver's process table directly, not through harness.bench.nvml

    holder = subprocess.Popen([sys.executable, "-c", CHILD + "import time; time.sleep(5)"], stdout=subprocess.PIPE,
                              text=True)
    try:
        pid = json.loads(holder.stdout.readline())["pid"]
        pynvml.nvmlInit()
        users = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            users += [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
        assert pid not in users, f"process {pid} holds GPU memory after only counting GPUs"
    finally:
        holder.kill()
        pynvml.nvmlShutdown()
