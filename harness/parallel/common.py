"""What every parallel model shares, Keras 3 or Keras 2: the split, timing, rebalancing, saving.

``ParallelCommon`` is mixed in before the Keras ``Model`` of each parallel
model (through ``base.ParallelModel``, for both Keras generations). It imports no Keras: where a Keras class is
needed, it is the one of the model's own Keras (``compat.keras_module_of``).
"""

from __future__ import annotations

import contextlib
from typing import Any

import tensorflow as tf

from harness.errors import InvalidType, Refused
from harness.split import shares, validate_ratios

__all__ = ["ParallelCommon", "Untracked"]

CALLBACKS_POSITION = 5  # fit(x, y, batch_size, epochs, verbose, callbacks, ...)


class Untracked:
    """Holds a value without Keras tracking it (its weights or variables stay out of the model's)."""

    def __init__(self, value):
        self.value = value


class ParallelCommon:
    """The split, emulated/timed devices, ``ratios="auto"``, XLA refusal and template saving."""

    devices: tuple[str, ...]
    ratios: tuple[float, ...]
    merge_device: str
    template: Any
    core: Any
    train_function: Any
    test_function: Any
    predict_function: Any

    def _init_common(self, devices, ratios, merge_device: str, emulator=None) -> None:
        """Sets devices, ratios, the split variable, the emulator and the (empty) rebalancer."""
        self._emulator_ref = Untracked(emulator)
        self._rebalancer_ref = Untracked(None)
        self.devices = tuple(devices)
        self.ratios = validate_ratios(ratios, len(self.devices))
        self.merge_device = merge_device
        # The split the step functions read: a variable, so set_ratios needs no retrace. Untracked:
        # it is no weight of the model (saving and get_weights never see it). tf.data hands batches
        # over on the host: the split is cut there.
        with tf.init_scope(), tf.device("/device:CPU:0"):
            shares_var = tf.Variable(shares(self.ratios), dtype=tf.float64, trainable=False, name="split_shares")
        self._shares_ref = Untracked(shares_var)

    # -- the split ---------------------------------------------------------------
    def set_ratios(self, ratios) -> tuple[float, ...]:
        """Splits the following batches by ``ratios``: same global batch, no retrace, still exact.

        The step functions read the split from a variable, so this takes effect
        from the next step, also between the steps of a running ``fit`` (what
        ``harness.Rebalance`` does). The in-graph split stays the one of
        ``harness.split.split_batch`` bit for bit.

        Args:
            ratios: one positive finite number per device.

        Returns:
            The ratios as floats (also ``self.ratios``).

        Raises:
            TypeError, ValueError: as ``harness.split.validate_ratios``.

        Example:
            >>> parallel.set_ratios([1000, 400])  # device 1 throttled to 400 samples/s
        """
        values = validate_ratios(ratios, len(self.devices))
        self._shares_ref.value.assign(shares(values))
        self.ratios = values
        return values

    # -- emulated and timed devices ---------------------------------------------
    @property
    def emulator(self):
        """The ``harness.emulate.Emulator`` slowing devices down or timing them, or None."""
        return self._emulator_ref.value

    @property
    def rebalancer(self):
        """The built-in ``Rebalance`` of ``ratios="auto"`` (a callback of the model's Keras), else None."""
        return self._rebalancer_ref.value

    def time_devices(self):
        """Logs every device's busy time; returns the ``Emulator`` that holds the log.

        A model built without ``emulate`` gets ``Emulator({}, timed=devices)``:
        its devices run at their own speed, their begin/end ops only stamp the
        time (what ``Rebalance`` measures). Adding devices to the log rebuilds
        the step functions once, so call it before training or from a
        callback's ``on_train_begin``.
        """
        from harness.emulate import Emulator

        emulator = self.emulator
        missing = [d for d in self.devices if emulator is None or d not in emulator.logged]
        if not missing:
            return emulator
        if emulator is None:
            self._emulator_ref.value = Emulator({}, timed=self.devices)
        else:
            emulator.add_timed(missing)
        # The step functions are traced with or without the begin/end ops: trace them again.
        if self.train_function is not None:
            self.make_train_function(force=True)
        self.test_function = None
        self.predict_function = None
        return self.emulator

    def gather_device_rows(self, rows: list[tuple[float, int, int]]) -> list[tuple[float, int, int]]:
        """Every device's ``(busy seconds, samples, steps)`` (``Rebalance``): this process measures them all
        here; across workers each measures its own and they are gathered (``multiworker``)."""
        return rows

    def _begin_device(self, device: str, x, weights: bool = True):
        """``(x, token)``: the device's slice, gated on its emulated start (if emulated or timed).

        An emulated link carries the slice in, and on a device other than the merge device, with ``weights``,
        the trained weights: towers read them from it, mirrored receives each update from it
        (``_remote_weights``; mirrored's inference reads its own copies: ``weights=False``).
        """
        if self.emulator is None:
            return x, None
        return self.emulator.begin(device, x, reads=self._remote_weights(device) if weights else (0, 0),
                                   staged=self._staged_now is not None, overlap=self.overlap)

    def _end_device(self, device: str, y, token):
        """The device's output, gated on its emulated finish (if emulated or timed); off the merge device, the
        output crosses the link to it."""
        return y if token is None else self.emulator.end(device, y, token, sends=self._is_remote(device))

    def _is_remote(self, device: str) -> bool:
        """Whether ``device`` is another device than the merge device (what it exchanges crosses its link)."""
        def key(name):
            spec = tf.DeviceSpec.from_string(name)
            return spec.job, spec.task, (spec.device_type or "").upper(), spec.device_index or 0

        here, merge = key(device), key(self.merge_device)
        return here[2:] != merge[2:] or (here[1] is not None and merge[1] is not None and here[1] != merge[1])

    def _remote_weights(self, device: str) -> tuple[int, int]:
        """``(bytes, tensors)`` of the trained weights, for a device other than the merge device; else none."""
        if not self._is_remote(device):
            return 0, 0
        from harness.emulate import variable_bytes

        return variable_bytes(self.core.trainable_weights)

    # -- compile: never XLA -----------------------------------------------------
    def compile(self, *args, jit_compile=None, **kwargs):
        """As ``Model.compile``, without XLA: ``"auto"`` (Keras 3) or None means off, ``True`` is refused.

        Keras 3's ``"auto"`` turns XLA on wherever a GPU is visible. The split
        sizes are tensors (partial batches, ``set_ratios``), which XLA needs as
        compile-time constants, and XLA cannot read variables placed on other
        devices (keras-team/keras#19005): the step would fail on the first GPU box.
        """
        if jit_compile is True:
            raise Refused(
                "jit-compile",
                "parallel models cannot be compiled with jit_compile=True: the ratio split's sizes change per "
                "batch (partial batches, set_ratios) and XLA needs them as compile-time constants, and XLA cannot "
                "read variables placed on other devices; use jit_compile=False (what 'auto' means here)"
            )
        super().compile(*args, jit_compile=False, **kwargs)

    # -- one trace per step function ----------------------------------------------------------
    # Variables created while a tf.function traces make TF trace it again. Built before the
    # first trace, Keras' lazily built optimizer slots and compiled metrics (and Keras 3's
    # compiled losses) no longer double the tracing time, the larger part of a short fit's time.
    def make_train_function(self, force=False):
        small = self._small_batches_possible
        if self.train_function is not None and self._traced_small not in (None, small):
            force = True  # traced for other batches: with the single-device path, or without it
        self._traced_small = small
        if self.optimizer is not None:
            self.build_optimizer()
        made = self.train_function
        super().make_train_function(force)  # sets train_function (Keras 3 returns nothing)
        if made is not None and self.train_function is made:  # Keras kept the one it has (ours, wrapped)
            return made
        self.train_function = self._adapter.first_call_builds(self, self._staged(self.train_function))
        return self.train_function

    # -- overlap: each device's next slice copied while the step runs (``staging``) ----------------
    _staging_supported = True  # across workers: each worker's own input pipeline (not staged)
    _staging_active = False  # inside fit
    _staged_now = None  # the staged batch the train step is being traced with

    @property
    def overlap(self) -> bool:
        """Whether ``fit`` stages each device's next slice while the step runs (``parallelize(overlap=...)``)."""
        return self._staging_supported and getattr(self, "_overlap", True)

    @overlap.setter
    def overlap(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise InvalidType(f"overlap must be True or False; got overlap={value!r}")
        self._overlap = value

    @property
    def _stager(self):
        ref = getattr(self, "_stager_ref", None)
        return None if ref is None else ref.value

    def _staged(self, keras_function):
        """The train function ``fit`` calls: a ``staging.Stager`` over Keras' own (kept across retraces, with
        the batch it staged)."""
        from harness.parallel.staging import Stager

        stager = self._stager
        if stager is None:
            stager = Stager(self, keras_function)
            self._stager_ref = Untracked(stager)
        else:
            stager.retrace(keras_function)
        return stager

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        # Keras 3 calls this from fit/evaluate/train_on_batch; without a distribution strategy
        # of its own (ours are inside the step) it would leave the building to the first trace.
        self._adapter.symbolic_build(self, iterator, data_batch)

    # -- batches smaller than the device count ------------------------------------------------
    # Such a batch runs the single-device step (``base.ParallelModel._by_batch_size``): a tf.cond
    # branch traced and optimised with every train step, a fifth to a third of a short fit's
    # time. A trace that knows its batch size (train_on_batch, a dataset of fixed batches) takes
    # the branch of that size alone. A fit on arrays knows its batch sizes before it starts: where
    # none is that small, its train step is traced without the branch (and asserts so at run time).
    # Anywhere else (datasets and generators of varying batches) the branch is there.
    _small_batches_possible = True  # read when the train step is traced
    _traced_small: bool | None = None  # what the current train_function was traced for

    def _fit_may_see_small_batches(self, args, kwargs) -> bool:
        import inspect

        from harness.compat import keras_module_of
        from harness.parallel.slicing import smallest_fit_batch

        try:
            given = inspect.signature(keras_module_of(self).Model.fit).bind(self, *args, **kwargs).arguments
        except TypeError:  # Keras' own fit will say what is wrong
            return True
        smallest = smallest_fit_batch(given.get("x"), given.get("batch_size"), given.get("validation_split"),
                                      given.get("steps_per_epoch"))
        return smallest is None or smallest < len(self.devices)

    # -- a refusal raised while Keras traces a step reaches the caller as itself -----------------
    # Keras 2's autograph turns an exception raised in a traced step into a StagingError where it cannot rebuild it
    # (a Refused takes two arguments): a step registers its refusal (``_refusing``) and fit/evaluate/predict raise it.
    _trace_refusal: Refused | None = None

    def _refusing(self, err: Refused) -> Refused:
        self._trace_refusal = err
        return err

    @contextlib.contextmanager
    def _trace_refusals(self):
        self._trace_refusal = None
        try:
            yield
        except Exception as err:
            refusal = self._trace_refusal
            if refusal is None or err is refusal:
                raise
            raise refusal.with_traceback(None) from err
        finally:
            self._trace_refusal = None

    def evaluate(self, *args, **kwargs):
        with self._trace_refusals():
            return super().evaluate(*args, **kwargs)  # the Keras Model's

    def predict(self, *args, **kwargs):
        with self._trace_refusals():
            return super().predict(*args, **kwargs)  # the Keras Model's

    # -- training keeps the template current; ratios="auto" adds its rebalancer ------------
    def fit(self, *args, **kwargs):
        with self._trace_refusals():
            return self._fit(*args, **kwargs)

    def _fit(self, *args, **kwargs):
        self._check_rebalance(args, kwargs)
        if self.rebalancer is not None:
            args, kwargs = self._with_rebalancer(args, kwargs)
        self._small_batches_possible = self._fit_may_see_small_batches(args, kwargs)
        self._staging_active = True
        try:
            return super().fit(*args, **kwargs)
        finally:
            self._staging_active = False
            if self._stager is not None:
                self._stager.drain()
            self._small_batches_possible = True
            self.sync_to_template()

    def _given_callbacks(self, args, kwargs):
        return args[CALLBACKS_POSITION] if len(args) > CALLBACKS_POSITION else kwargs.get("callbacks")

    def _check_rebalance(self, args, kwargs) -> None:
        """Refuses a ``Rebalance`` of another Keras, which this Keras' ``fit`` would fail on obscurely."""
        from harness.compat import keras_module_of
        from harness.parallel.rebalance import is_rebalance

        k = keras_module_of(self)
        given = self._given_callbacks(args, kwargs)
        given = given.callbacks if isinstance(given, k.callbacks.CallbackList) else list(given or [])
        if any(is_rebalance(c) and not isinstance(c, k.callbacks.Callback) for c in given):
            raise InvalidType(f"this is a {k.__name__} model: its fit needs a {k.__name__} callback; use harness."
                              f"parallel.rebalance.rebalance_class({k.__name__})(...) instead of harness.Rebalance")

    def _with_rebalancer(self, args, kwargs):
        """``fit``'s arguments with the built-in rebalancer added, unless the caller passed a ``Rebalance``."""
        from harness.compat import keras_module_of
        from harness.parallel.rebalance import is_rebalance

        args = list(args)
        positional = len(args) > CALLBACKS_POSITION
        given = self._given_callbacks(args, kwargs)
        if isinstance(given, keras_module_of(self).callbacks.CallbackList):
            if not any(is_rebalance(c) for c in given.callbacks):
                given.callbacks.append(self.rebalancer)
                self.rebalancer.set_model(self)
            return tuple(args), kwargs
        given = list(given or [])
        if not any(is_rebalance(c) for c in given):
            given.append(self.rebalancer)
        if positional:
            args[CALLBACKS_POSITION] = given
        else:
            kwargs["callbacks"] = given
        return tuple(args), kwargs

    # -- persistence: always the plain single-device model -------------------
    def sync_to_template(self) -> None:
        """Copies trained weights into the template (no-op when they are shared).

        ``fit`` and the save methods call it; after ``train_on_batch`` loops call
        it yourself (not per step: for mirrored models it copies every weight).
        """

    def _sync_from_template(self) -> None:
        """Copies template weights into the trained model (no-op when shared)."""

    def save(self, filepath, *args, **kwargs):
        """Saves the template model, loadable by ``load_model`` without harness."""
        self.sync_to_template()
        return self.template.save(filepath, *args, **kwargs)

    def save_weights(self, filepath, *args, **kwargs):
        self.sync_to_template()
        return self.template.save_weights(filepath, *args, **kwargs)

    def load_weights(self, filepath, *args, **kwargs):
        status = self.template.load_weights(filepath, *args, **kwargs)
        self._sync_from_template()
        return status

    def get_config(self):
        raise NotImplementedError(
            "a parallel model is not serialised itself: save() writes the single-device template model"
        )
