"""Model outputs as rayline answers them: class probabilities (n, classes) or values (n,)."""

from __future__ import annotations

import numpy as np

__all__ = ["softmax"]


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=1, keepdims=True)
