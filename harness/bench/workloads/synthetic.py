"""Deterministic synthetic data with learnable structure, in NumPy only.

Every workload's data comes from two generators: a fixed *task* generator (the
teacher: class templates, a Markov chain, a hyperplane), seeded from the workload
and size alone, and a *sample* generator seeded by the caller. So two seeds draw
different samples of the same task (a train and a validation set agree on what
the labels mean), and the same seed always draws the same samples.
"""

from __future__ import annotations

import zlib
from enum import Enum

import numpy as np

from harness.errors import InvalidValue

__all__ = [
    "Labels",
    "task_rng",
    "sample_rng",
    "check_samples",
    "low_res_templates",
    "upsample",
    "one_hot",
    "markov_chain",
    "walk",
]


class Labels(str, Enum):
    """How a workload encodes its targets (each pairs with one logits loss)."""

    ONE_HOT = "one_hot"  # float32 (classes,), CategoricalCrossentropy(from_logits=True)
    SPARSE = "sparse"  # int32 scalar class index, SparseCategoricalCrossentropy(from_logits=True)
    BINARY = "binary"  # float32 (1,) in {0, 1}, BinaryCrossentropy(from_logits=True)


def task_rng(name: str, size: str) -> np.random.Generator:
    """The teacher's generator: fixed per workload and size, independent of the sample seed."""
    return np.random.default_rng(zlib.crc32(f"harness.bench.workloads/{name}/{size}".encode()))


def sample_rng(seed: int) -> np.random.Generator:
    """The generator samples are drawn from; raises ValueError for a seed that is not an int >= 0."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InvalidValue(f"seed must be an integer >= 0; got seed={seed!r}")
    return np.random.default_rng(int(seed))


def check_samples(samples: int) -> int:
    """``samples`` as an int, or ValueError unless it is a positive integer."""
    if isinstance(samples, bool) or not isinstance(samples, (int, np.integer)) or samples < 1:
        raise InvalidValue(f"samples must be a positive integer; got samples={samples!r}")
    return int(samples)


def low_res_templates(task: np.random.Generator, classes: int, shape: tuple[int, int, int], block: int) -> np.ndarray:
    """Low-resolution class templates, ``(classes, H // block, W // block, C)`` float32 in [0, 1).

    Stored small and upsampled per sample (``upsample``), so 1000 ImageNet-sized
    templates cost 600 KB instead of 600 MB.
    """
    height, width, channels = shape
    if height % block or width % block:
        raise InvalidValue(f"block={block} must divide the image size {height}x{width}")
    return task.random((classes, height // block, width // block, channels), dtype=np.float32)


def upsample(low: np.ndarray, block: int) -> np.ndarray:
    """Nearest-neighbour upsampling of ``(N, h, w, C)`` to ``(N, h * block, w * block, C)``."""
    return np.repeat(np.repeat(low, block, axis=1), block, axis=2)


def one_hot(labels: np.ndarray, classes: int) -> np.ndarray:
    """float32 one-hot rows for integer ``labels``."""
    return np.eye(classes, dtype=np.float32)[labels]


def markov_chain(
    task: np.random.Generator, states: int, successors: int, concentration: float = 0.5
) -> tuple[np.ndarray, np.ndarray]:
    """A random sparse transition table: each state moves to one of ``successors`` states.

    Returns ``(next_states, cumulative_probs)``, both ``(states, successors)``;
    a small Dirichlet ``concentration`` makes some moves much likelier than others,
    so the next state is predictable from the current one (but not certain).
    """
    next_states = task.integers(0, states, size=(states, successors))
    probs = task.dirichlet(np.full(successors, concentration), size=states)
    return next_states, np.cumsum(probs, axis=1)


def walk(rng: np.random.Generator, chain: tuple[np.ndarray, np.ndarray], samples: int, length: int) -> np.ndarray:
    """``(samples, length)`` int sequences walked on ``chain`` from uniform random starts."""
    next_states, cumulative = chain
    out = np.empty((samples, length), dtype=np.int64)
    out[:, 0] = rng.integers(0, next_states.shape[0], size=samples)
    for t in range(1, length):
        u = rng.random(samples)
        # Index of the first cumulative probability above u (the last one guards rounding).
        choice = np.minimum((u[:, None] > cumulative[out[:, t - 1]]).sum(axis=1), next_states.shape[1] - 1)
        out[:, t] = next_states[out[:, t - 1], choice]
    return out
