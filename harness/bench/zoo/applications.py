"""``keras.applications`` architectures (``weights=None``, their minimum input) at CPU size.

Each model is the public constructor's own graph, cut after its first stages (stem and the
first blocks, named below), with global average pooling and a Dense head: the way these networks
serve as backbones (keras-io's DeepLabV3+ cuts ResNet50 the same way). Whole networks took 10 to
58 s per single-device training on a busy 2-core CPU (tracing their 130-770 layers; a parallel run
traces them once per device), far beyond a zoo that must run every model x method x split in
minutes; the blocks that matter for exactness (BatchNormalization, depthwise, separable and grouped
convolutions, squeeze-excite, residual adds, dense concatenation, LayerScale, nested Sequential
stems) are all in the first stages. Of Xception and NASNetMobile, Xception is here: NASNetMobile's
stem and first reduction cell alone (54 layers) cost twice as much as any other entry.

The full constructor runs once per Keras module and dtype policy; each ``build`` clones the cut
model (new layers, new initial weights) so a conformance case builds in milliseconds.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from functools import partial

from harness.bench.zoo.entry import ZooEntry, images, sgd, sparse_ce

__all__ = ["ENTRIES"]

CLASSES = 5


@dataclass(frozen=True)
class _Backbone:
    app: str  # the keras.applications constructor
    kwargs: tuple[tuple[str, object], ...]
    cut: tuple[str, ...]  # the layer whose output (or input) ends the model; Keras 3 / Keras 2 names
    at: str = "output"  # "input": the cut layer's input (a residual add that is an op, not a layer)


def _without_dropout(model) -> None:
    # Dropout draws random masks: two runs of one model would differ for that alone.
    for layer in model.layers:
        if "Dropout" in type(layer).__name__:
            layer.rate = 0.0


def _cut(k, spec: _Backbone):
    base = getattr(k.applications, spec.app)(weights=None, include_top=False, **dict(spec.kwargs))
    names = {layer.name for layer in base.layers}
    name = next((n for n in spec.cut if n in names), None)
    if name is None:
        raise ValueError(f"{spec.app} of {k.__name__} {k.__version__} has none of the layers {list(spec.cut)}")
    features = getattr(base.get_layer(name), spec.at)
    pooled = k.layers.GlobalAveragePooling2D(name="zoo_pool")(features)
    model = k.Model(base.inputs, k.layers.Dense(CLASSES, name="zoo_logits")(pooled), name=f"{spec.app}_cut")
    _without_dropout(model)
    return model


@functools.cache
def _prototype(k, spec: _Backbone, policy: str, floatx: str):
    """The cut model each build clones, one per Keras module, backbone, dtype policy and floatx (a float64
    or mixed build gets its own, built under that policy)."""
    return _cut(k, spec)


def _build(spec: _Backbone, k):
    return k.models.clone_model(_prototype(k, spec, k.mixed_precision.global_policy().name, k.backend.floatx()))


def _data(size: int, low: float, high: float):
    x, y = images(27, (size, size, 3), CLASSES, low, high)
    return x, y, None  # 27 samples: batch 10 ends each epoch on a batch of 7


def _entry(name: str, spec: _Backbone, params: str, size: int = 32, low: float = -1.0,
           high: float = 1.0) -> ZooEntry:
    return ZooEntry(
        name=name,
        source=f"keras.applications.{spec.app}",
        params=params,
        builder=partial(_build, spec),
        data=partial(_data, size, low, high),
        loss=sparse_ce,
        optimizer=sgd,
        metrics=lambda k: ["accuracy"],
    )


ENTRIES = (
    _entry("mobilenet_v2", _Backbone("MobileNetV2", (("input_shape", (32, 32, 3)), ("alpha", 0.35)), ("block_2_add",)),
           "alpha=0.35, 32x32, up to block_2_add (27 layers)"),
    _entry("mobilenet_v3_small",
           _Backbone("MobileNetV3Small", (("input_shape", (32, 32, 3)), ("alpha", 0.75)),
                     ("expanded_conv_2_add", "expanded_conv_2/Add")),
           "alpha=0.75, 32x32, up to expanded_conv_2 (squeeze-excite, 35 layers), inputs 0-255", low=0, high=255),
    _entry("resnet50", _Backbone("ResNet50", (("input_shape", (32, 32, 3)),), ("conv2_block1_out",)),
           "32x32, up to conv2_block1_out (bottleneck with projection, 19 layers)", low=-128, high=128),
    _entry("efficientnet_b0", _Backbone("EfficientNetB0", (("input_shape", (32, 32, 3)),), ("block2a_project_bn",)),
           "32x32, up to block2a (MBConv + squeeze-excite, 31 layers), inputs 0-255", low=0, high=255),
    _entry("densenet121", _Backbone("DenseNet121", (("input_shape", (32, 32, 3)),), ("conv2_block2_concat",)),
           "32x32, up to conv2_block2_concat (dense connections, 21 layers)"),
    _entry("convnext_tiny",
           _Backbone("ConvNeXtTiny", (("input_shape", (32, 32, 3)),),
                     ("convnext_tiny_stage_0_block_1_depthwise_conv",), at="input"),
           "32x32, stochastic depth off (drop_path_rate=0), stem + stage 0 block 0 (grouped conv, LayerScale), "
           "inputs 0-255", low=0, high=255),
    _entry("xception", _Backbone("Xception", (("input_shape", (71, 71, 3)),), ("block3_sepconv1_act",), at="input"),
           "71x71 (its minimum), entry flow blocks 1-2 + residual add (17 layers)", size=71),
)
