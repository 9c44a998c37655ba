"""tune.search: how a sweep picks each trial's parameters, one class each, registered in SEARCHERS.

Every searcher gets Tune's param_space as `rayline.tune.sweep.search_space(spec)` makes it and
the same seed (`tune.seed`, default `data.split.seed`), so a sweep is reproducible; the
trials running at once are limited by the resource plan, inside the search algorithm
(Tune ignores `max_concurrent_trials` for a BasicVariantGenerator, with only a warning).
Ray is imported only in `build`.
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar

__all__ = ["SEARCHERS", "SEARCH_NAMES", "Searcher", "search_seed", "PRIMITIVE"]

# What Optuna's CategoricalDistribution takes as a choice; anything else (a list of layer
# sizes, a model family's mapping) is drawn by its index and mapped back.
PRIMITIVE = (type(None), bool, int, float, str)


def search_seed(spec) -> int:
    """The sweep's seed: `tune.seed`, else `data.split.seed` (as random search always used)."""
    seed = getattr(spec.tune, "seed", None)
    return spec.data.split.seed if seed is None else seed


class Searcher:
    """One tune.search."""

    name: ClassVar[str]
    description: ClassVar[str]

    def build(self, spec, *, metric: str, mode: str, concurrency: int):
        """Tune's search algorithm for `spec` (its param_space is passed to the Tuner)."""
        raise NotImplementedError


class RandomSearch(Searcher):
    name = "random"
    description = "independent random draws from each distribution"

    def build(self, spec, *, metric, mode, concurrency):
        from ray.tune.search import BasicVariantGenerator

        return BasicVariantGenerator(max_concurrent=concurrency, random_state=search_seed(spec))


class GridSearch(RandomSearch):
    name = "grid"
    description = "every combination of the listed values (search_space makes each a grid_search)"


class OptunaTPE(Searcher):
    """Optuna's TPE sampler through Ray Tune's OptunaSearch: later trials are drawn where earlier ones scored well."""

    name = "optuna"
    description = "Bayesian optimisation (Optuna's TPE)"

    def build(self, spec, *, metric, mode, concurrency):
        from ray.tune.search import ConcurrencyLimiter
        from ray.tune.search.optuna import OptunaSearch

        inner = OptunaSearch(metric=metric, mode=mode, seed=search_seed(spec))
        return ConcurrencyLimiter(_by_index(inner), max_concurrent=concurrency)


SEARCHERS: dict[str, Searcher] = {cls.name: cls() for cls in (RandomSearch, GridSearch, OptunaTPE)}
SEARCH_NAMES = tuple(SEARCHERS)


def encode_space(config: dict) -> tuple[dict, dict[str, list]]:
    """(param_space Optuna can take, key -> the listed values drawn by index).

    A `grid_search` becomes a categorical choice (a model-based searcher draws, it does not
    enumerate); a choice among values Optuna cannot store becomes a choice among indices.
    """
    from ray import tune
    from ray.tune.search.sample import Categorical

    encoded, table = {}, {}
    for key, value in config.items():
        if isinstance(value, dict) and set(value) == {"grid_search"}:
            values = list(value["grid_search"])
        elif isinstance(value, Categorical):
            values = list(value.categories)
        else:
            encoded[key] = value
            continue
        if all(isinstance(v, PRIMITIVE) for v in values):
            encoded[key] = tune.choice(values)
        else:
            table[key] = values
            encoded[key] = tune.choice(list(range(len(values))))
    return encoded, table


def decode(config: Any, table: dict[str, list]) -> Any:
    """A suggestion with each index drawn for a non-primitive choice mapped back to its value."""
    if not isinstance(config, dict):
        return config  # None (wait) or Searcher.FINISHED
    return {k: (copy.deepcopy(table[k][int(v)]) if k in table else v) for k, v in config.items()}


def _by_index(inner):
    """`inner` (a Tune Searcher) drawing non-primitive choices by index, its trials seeing the values."""
    from ray.tune.search import Searcher as TuneSearcher

    class ByIndex(TuneSearcher):
        def __init__(self):
            super().__init__(metric=inner.metric, mode=inner.mode)
            self.inner = inner
            self.table: dict[str, list] = {}

        def set_search_properties(self, metric, mode, config, **spec):
            encoded, self.table = encode_space(config)
            if metric:
                self._metric = metric
            if mode:
                self._mode = mode
            return self.inner.set_search_properties(metric, mode, encoded, **spec)

        def suggest(self, trial_id):
            return decode(self.inner.suggest(trial_id), self.table)

        def on_trial_result(self, trial_id, result):
            self.inner.on_trial_result(trial_id, result)

        def on_trial_complete(self, trial_id, result=None, error=False):
            self.inner.on_trial_complete(trial_id, result=result, error=error)

        # Tune saves and restores the searcher's state with the sweep's (resume); the table
        # comes back from set_search_properties, which Tune calls again with the param_space.
        def save(self, checkpoint_path):
            self.inner.save(checkpoint_path)

        def restore(self, checkpoint_path):
            self.inner.restore(checkpoint_path)

    ByIndex.__name__ = ByIndex.__qualname__ = f"ByIndex{type(inner).__name__}"
    return ByIndex()
