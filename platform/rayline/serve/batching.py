"""Dynamic batching of encoded requests with Ray Serve's `@serve.batch`.

Each request validates and encodes its own rows (so its errors stay its own); the batcher
merges the float32 matrices of concurrent requests, calls the model once, splits the
outputs by row count and hands each caller exactly its own rows. `max_batch_size` counts
rows, not requests (`batch_size_fn`); a request with at least that many rows is already a
batch and calls the model directly.

Defaults (serve.batching: max_batch_size 64, wait_timeout_ms 2) measured on the 2-core
development machine, digits torch MLP, one row per request, see the table in
tests/integration/test_serving.py's module docstring.
"""

from __future__ import annotations

from typing import Callable, Union

import numpy as np

from rayline.errors import PredictionError

__all__ = ["Batcher"]

Infer = Callable[[np.ndarray], np.ndarray]


def _rows(items: list[np.ndarray]) -> int:
    return sum(len(x) for x in items)


class Batcher:
    """`await batcher(x)` -> the model's outputs for x's rows, computed together with others'."""

    def __init__(self, infer: Infer, max_batch_size: int, wait_timeout_s: float):
        from ray import serve

        self._infer = infer
        self.max_batch_size = max_batch_size
        self._batched = serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=wait_timeout_s,
                                    batch_size_fn=_rows)(self._infer_batch)

    async def __call__(self, x: np.ndarray) -> np.ndarray:
        if len(x) >= self.max_batch_size:
            return self._infer(x)
        result = await self._batched(x)
        if isinstance(result, Exception):
            raise result
        return result

    async def _infer_batch(self, xs: list[np.ndarray]) -> list[Union[np.ndarray, Exception]]:
        if len(xs) == 1:
            try:
                return [self._infer(xs[0])]
            except PredictionError as exc:
                return [exc]
        try:
            outputs = self._infer(np.concatenate(xs))
        except PredictionError:
            # Some row gave a non-finite output: the error must reach only its own request,
            # and name the row by its index there, so run each request alone (rare path).
            return [self._alone(x) for x in xs]
        bounds = np.cumsum([len(x) for x in xs])[:-1]
        return np.split(outputs, bounds)

    def _alone(self, x: np.ndarray) -> Union[np.ndarray, Exception]:
        try:
            return self._infer(x)
        except PredictionError as exc:
            return exc

