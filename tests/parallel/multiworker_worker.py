"""One worker of a multi-worker equivalence run (started by tests/parallel/test_multiworker.py via harness launch).

Every worker trains the same model on the same global batches with ``parallelize(model, cluster, ratios)``;
the chief (worker 0) also trains it on one device and prints one JSON line: ``RESULT {...}`` with the
largest weight deviation and both runs' per-epoch losses.

Usage: python multiworker_worker.py MODEL RATIOS SAMPLES BATCH [--sample-weight] [--epochs N] [--keras2]
    [--activity] [--save DIR] [--emulate SPEC] [--optimizer SPEC]   (RATIOS: 3:1 or auto)
(each worker's device count: ``harness launch --devices-per-worker``)
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from file_audit import audit_writes  # noqa: E402  (beside this script)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("model", choices=["dense", "bn", "tokens"])
    p.add_argument("ratios")
    p.add_argument("samples", type=int)
    p.add_argument("batch", type=int)
    p.add_argument("--sample-weight", action="store_true")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--keras2", action="store_true", help="a Keras 2 (tf_keras) model")
    p.add_argument("--emulate", default=None, help="emulated devices, one RATE per device of the cluster")
    p.add_argument("--activity", action="store_true", help="an activity regulariser (a call-time loss)")
    p.add_argument("--save", default=None, metavar="DIR",
                   help="every worker calls parallel.save(DIR/model.keras): the chief alone writes it")
    p.add_argument("--optimizer", default="SGD(0.1)",
                   help="a keras.optimizers expression, e.g. 'Adam(0.05, global_clipnorm=0.05)' (default SGD(0.1))")
    p.add_argument("--die-at-step", type=int, default=None,
                   help="worker 1 kills itself (SIGKILL) before this training step: a lost peer")
    args = p.parse_args()
    written = audit_writes(args.save) if args.save else []

    import harness

    cluster = harness.use_cluster(timeout_s=120)  # first: it starts this worker's server; generous on a busy host
    import numpy as np

    if args.keras2:  # the environment's Keras 2: tf_keras, or TF 2.15's own keras
        try:
            import tf_keras as keras
        except ImportError:
            import keras
    else:
        import keras

    import tensorflow as tf

    class TokensAndPositions(keras.layers.Layer):
        """keras-io's TokenAndPositionEmbedding: looked-up tokens plus learned positions (``range``)."""

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.tokens, self.positions = keras.layers.Embedding(20, 4), keras.layers.Embedding(6, 4)

        def call(self, x):
            return self.tokens(x) + self.positions(tf.range(6))[None]

    def optimizer():
        return eval("keras.optimizers." + args.optimizer, {"keras": keras})  # a test's own expression

    def build():
        keras.utils.set_random_seed(0)
        if args.model == "tokens":  # token and learned position lookups: sparse gradients of both kinds
            tokens = keras.Input((6,), dtype="int32")
            hidden = TokensAndPositions()(tokens)
            return keras.Model(tokens, keras.layers.Dense(2)(keras.layers.GlobalAveragePooling1D()(hidden)))
        regulariser = keras.regularizers.L2(0.01) if args.activity else None
        layers = [keras.Input((6,)), keras.layers.Dense(16, activation="tanh", activity_regularizer=regulariser)]
        if args.model == "bn":
            layers.append(keras.layers.BatchNormalization())
        layers.append(keras.layers.Dense(2))
        return keras.Sequential(layers)

    rng = np.random.RandomState(0)
    x = rng.randint(0, 20, (args.samples, 6)).astype("int32") if args.model == "tokens" else \
        rng.rand(args.samples, 6).astype("float32")
    y = np.stack([x.sum(1), x[:, 0] - x[:, 1]], axis=1).astype("float32") / (20.0 if args.model == "tokens" else 1.0)
    weights = rng.rand(args.samples).astype("float32") + 0.5 if args.sample_weight else None
    ratios = "auto" if args.ratios == "auto" else [float(r) for r in args.ratios.split(":")]

    template = build()
    parallel = harness.parallelize(template, cluster, ratios=ratios, emulate=args.emulate)
    parallel.compile(optimizer=optimizer(), loss="mse")
    callbacks = []
    if args.die_at_step is not None and cluster.index == 1:
        import signal

        class Die(keras.callbacks.Callback):
            def on_train_batch_begin(self, batch, logs=None):
                if batch == args.die_at_step:
                    print("dying", flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)

        callbacks.append(Die())
    history = parallel.fit(x, y, sample_weight=weights, batch_size=args.batch, epochs=args.epochs, verbose=0,
                           shuffle=False, callbacks=callbacks)
    if args.save:
        parallel.save(os.path.join(args.save, "model.keras"))
    evaluated = parallel.evaluate(x, y, batch_size=args.batch, verbose=0)
    predicted = parallel.predict(x, batch_size=args.batch, verbose=0)
    if not cluster.is_chief:
        print("RESULT " + json.dumps({"worker": cluster.index, "local_devices": list(cluster.local_devices),
                                      "written": written, "ratios": list(parallel.ratios),
                                      "loss": history.history["loss"],
                                      "evaluate": float(evaluated)}), flush=True)
        return 0
    single = build()
    single.compile(optimizer=optimizer(), loss="mse")
    reference = single.fit(x, y, sample_weight=weights, batch_size=args.batch, epochs=args.epochs, verbose=0,
                           shuffle=False)
    deviation = max(float(np.max(np.abs(a - b))) for a, b in zip(template.get_weights(), single.get_weights()))
    print("RESULT " + json.dumps({
        "worker": cluster.index, "devices": list(cluster.devices), "local_devices": list(cluster.local_devices),
        "written": written, "deviation": deviation, "ratios": list(parallel.ratios),
        "resplits": [e["step"] for e in parallel.rebalancer.history if e["resplit"]] if parallel.rebalancer else [],
        "loss": history.history["loss"], "single_loss": reference.history["loss"],
        "evaluate": float(evaluated), "single_evaluate": float(single.evaluate(x, y, batch_size=args.batch, verbose=0)),
        "predict_deviation": float(np.max(np.abs(predicted - single.predict(x, batch_size=args.batch, verbose=0)))),
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
