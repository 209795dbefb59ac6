"""Seed 004's image model: ResNet50 (25,636,712 parameters at 224x224x3, 1000 classes).

Seed 004 (a public analysis of multi-GPU Keras, docs/background.md) studied
image-processing models; ResNet50 is the standard one, and the one with BatchNormalization everywhere, which exactness
under uneven splits has to survive. ``full`` is ``keras.applications.ResNet50``
with random weights (``weights=None``: nothing is ever downloaded) and logits
out. ``tiny`` is a CPU-sized residual net made of the same v1 bottleneck block
(1x1 reduce with the stride, 3x3, 1x1 expand x4, each followed by
BatchNormalization; projection shortcut on the first block of a stage, identity
after) on 32x32x3 images and 10 classes.

Data: each image a fixed low-resolution class template plus noise, roughly
zero-mean like preprocessed ImageNet, with integer labels (1000 classes one-hot
would be 4 KB a sample for nothing).
"""

from __future__ import annotations

import numpy as np

from harness.bench.workloads import synthetic

NAME = "resnet50"
LABELS = synthetic.Labels.SPARSE
INPUT_SHAPES = {"full": (224, 224, 3), "tiny": (32, 32, 3)}
OUTPUT_SHAPES = {"full": (1000,), "tiny": (10,)}

# tiny: stem filters, then (bottleneck filters, blocks, stride) per stage; blocks expand x4.
_TINY_STEM = 16
_TINY_STAGES = ((8, 2, 1), (16, 1, 2), (32, 1, 2))
_BN_EPSILON = 1.001e-5  # keras.applications.resnet's value
_BLOCK = {"full": 32, "tiny": 4}  # template resolution: 7x7 and 8x8, upsampled
_NOISE = 0.5


def build(size: str, keras):
    """A new, built, uncompiled model for ``size`` whose output is class logits."""
    if size == "full":
        # classifier_activation=None: logits, the loss applies the softmax.
        return keras.applications.ResNet50(
            weights=None,
            input_shape=INPUT_SHAPES["full"],
            classes=OUTPUT_SHAPES["full"][0],
            classifier_activation=None,
        )
    return _tiny_resnet(keras)


def _conv_bn(keras, h, filters: int, kernel: int, stride: int = 1, relu: bool = True):
    # No bias before BatchNormalization: BN's shift makes it redundant, its gradient is zero
    # in exact arithmetic, and Adam would turn the float noise in it into steps.
    h = keras.layers.Conv2D(filters, kernel, strides=stride, padding="same", use_bias=False)(h)
    h = keras.layers.BatchNormalization(epsilon=_BN_EPSILON)(h)
    return keras.layers.Activation("relu")(h) if relu else h


def _bottleneck(keras, h, filters: int, stride: int, project: bool):
    """ResNet v1 bottleneck, as ``keras.applications.resnet``'s ``block1``."""
    if project:
        shortcut = _conv_bn(keras, h, 4 * filters, 1, stride, relu=False)
    else:
        shortcut = h
    h = _conv_bn(keras, h, filters, 1, stride)
    h = _conv_bn(keras, h, filters, 3)
    h = _conv_bn(keras, h, 4 * filters, 1, relu=False)
    return keras.layers.Activation("relu")(keras.layers.Add()([shortcut, h]))


def _tiny_resnet(keras):
    inputs = keras.Input(INPUT_SHAPES["tiny"])
    # Stem: ResNet50's 7x7/2 conv + 3x3/2 pool (a quarter of the resolution), with a 3x3 conv.
    h = _conv_bn(keras, inputs, _TINY_STEM, 3, stride=2)
    h = keras.layers.MaxPooling2D(3, strides=2, padding="same")(h)
    for filters, blocks, stride in _TINY_STAGES:
        for i in range(blocks):
            h = _bottleneck(keras, h, filters, stride if i == 0 else 1, project=i == 0)
    h = keras.layers.GlobalAveragePooling2D()(h)
    outputs = keras.layers.Dense(OUTPUT_SHAPES["tiny"][0])(h)
    return keras.Model(inputs, outputs, name=f"{NAME}_tiny")


def loss(keras):
    """Sparse categorical crossentropy on logits."""
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def optimizer(keras):
    """SGD with momentum 0.9 at learning rate 0.1 (batch 256): the ResNet paper's recipe."""
    return keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)


def make_data(size: str, samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)``: float32 images ``(samples, H, W, 3)`` and int32 labels ``(samples,)``."""
    rng = synthetic.sample_rng(seed)
    samples = synthetic.check_samples(samples)
    classes = OUTPUT_SHAPES[size][0]
    block = _BLOCK[size]
    templates = synthetic.low_res_templates(synthetic.task_rng(NAME, size), classes, INPUT_SHAPES[size], block)
    labels = rng.integers(0, classes, size=samples)
    x = synthetic.upsample(2.0 * templates[labels] - 1.0, block)
    x += _NOISE * rng.standard_normal(x.shape, dtype=np.float32)
    return x, labels.astype(np.int32)
