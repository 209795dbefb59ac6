"""The options of the tf.data pipelines harness builds itself (its synthetic batches, a user's arrays, the
tuner's probes); a user's own dataset keeps its own."""

from __future__ import annotations


def still_options(tf):
    """``tf.data.Options`` without tf.data's autotuning model (its prefetch buffers still grow as they need).

    The model runs on a thread of its own, and an iterator of ``fit`` freed by the garbage collector waited for
    that thread while holding the interpreter (gdb: ``RootDataset::Iterator::~Iterator`` waiting on the thread in
    ``Model::OptimizeLoop``): full collections in ``harness tune`` took 4 to 20 s instead of 0.3 s, at whatever
    point of a run they fell (3 of 3 runs each way, TF 2.21). harness' own synthetic batches need no tuning; a
    user's own dataset keeps the options it has.
    """
    options = tf.data.Options()
    options.autotune.enabled = False
    return options
