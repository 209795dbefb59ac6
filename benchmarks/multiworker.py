"""Samples/s across workers: ``harness run --workers 2`` on a loopback cluster of 2 worker processes, 1 device each.

``track_samples_per_second`` is ``harness.bench.cluster_run.launch_run``, what ``harness run
--workers 2`` runs: two local worker processes (``harness.launch``), each joining the cluster
and training the grid's workload on its device, in windows cut at the same steps; the figure is
the median window of the chief. Splits: harness' model (``mirrored``) on the even split and on
the tuned one (``harness.bench.gridrun.split_batches``, the grid's first two devices), and the stock
baseline (``keras``: Keras 2's ``fit``, tf_keras, under a stock ``MultiWorkerMirroredStrategy``,
even split, the dataset of global batches distributed by ``fit`` itself; Keras 3.15.1's ``fit``
cannot run under that strategy: keras-team/keras#20585).

On the ci grid the two workers emulate the grid's first two devices (``2000::5`` and
``1000::10``): the tuned split beats the even one, where the slow device bounds every step. A
host-bound figure is skipped, as in ``throughput``; so is the stock baseline where tf_keras is not
installed, with the reason. Each combination starts two TensorFlow processes (~10 s on 2 cores)
besides asv's own, which imports no TensorFlow here.
"""

from __future__ import annotations

from . import common

GRID = common.current_grid()
WORKERS = 2  # one device each: the grid's first two


class MultiWorker:
    """Samples/s of a 2-worker loopback cluster: harness even and tuned, the stock baseline (tf_keras) even."""

    params = [["mirrored", "keras"], ["even", "tuned"]]
    param_names = ["method", "split"]
    timeout = GRID.timeout + 60  # two worker processes start TensorFlow each
    setup_cache = staticmethod(common.setup_profiles)

    def setup(self, profiles, method, split):
        from harness.bench.cluster_run import ClusterPlan, stock_keras_name, stock_refusal_text
        from harness.devices import gpu_count

        common.check_combination(method, split, WORKERS)
        if method == "keras" and stock_keras_name() is None:
            raise NotImplementedError(stock_refusal_text())
        gridrun, workload = common.gridrun(), GRID.workloads[0]
        batches = gridrun.split_batches(GRID, profiles, workload, split, WORKERS)
        if min(batches) < 1:
            raise NotImplementedError(f"the {split} split {list(batches)} leaves a worker without rows")
        specs = gridrun.emulated(GRID, WORKERS)
        if specs is None and gpu_count() < WORKERS:
            raise NotImplementedError(f"{WORKERS} workers with one GPU each; this machine has {gpu_count()}")
        self.plan = ClusterPlan(workload, GRID.size, method, (1,) * WORKERS, batches, seconds=GRID.seconds,
                                windows=GRID.windows, warmup_steps=GRID.warmup_steps, emulate=specs,
                                kind="CPU" if specs is not None else "GPU")

    def track_samples_per_second(self, profiles, method, split):
        import io
        import sys

        from harness.bench.cluster_run import cluster_result, launch_run
        from harness.bench.runner import host_bound

        plan = self.plan
        windows: list[dict] = []
        log = io.StringIO()
        launched, ends, problems = launch_run(plan, on_window=windows.append, relay=log,
                                              timeout_s=self.timeout - 20, grace_s=2.0)
        result = cluster_result(plan, windows, ends, launched.status, launched.first_failure, launched.reason)
        if problems and result["status"] == "complete":
            result.update(status="failed", error=problems[0])
        what = f"{plan.method} across {plan.workers} workers with batches {list(plan.batches)}"
        if result["status"] != "complete":
            sys.stderr.write(log.getvalue()[-4000:])
            raise RuntimeError(f"{what}: {result['status']}: {result['error']}")
        common.refuse_host_bound(host_bound(result), what)
        return result["summary"]["samples_per_second"]["median"]

    track_samples_per_second.unit = "samples/s"
