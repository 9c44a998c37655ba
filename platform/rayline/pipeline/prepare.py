"""The data stage: read, split and fit the preprocessing once for every preprocessing
configuration a sweep draws (the read and the split happen once for all), from the workspace's
data cache when it holds them.
"""

from __future__ import annotations

from typing import Callable

from rayline.errors import InterruptedRun
from rayline.spec import PipelineSpec
from rayline.workspace import Workspace

__all__ = ["prepare_stage"]


def prepare_stage(spec: PipelineSpec, ws: Workspace, *, data_cache: bool,
                  on_stage: Callable[[str, str, str], None]) -> list:
    """One `PreparedData` per preprocessing variant of the spec (one without a sweep over
    preprocessing), the spec's own first. Ctrl-C: InterruptedRun, nothing trained or registered."""
    from rayline.data import prepare_variants
    from rayline.data.cache import DataCache
    from rayline.data.task_cpus import fitted_to_free_cpus
    from rayline.spec import apply_overrides
    from rayline.spec.pipeline_space import PipelineSpace

    source = spec.data.source
    on_stage("data", "start", f"{source.format} {source.name or source.path}")
    variants = PipelineSpace(spec).variants() if spec.tune else [{}]
    try:
        # Read and map tasks fitted to the CPUs that are free (served models may hold most of them):
        # run on the share left, or fail now naming who holds them, never wait for a whole CPU.
        with fitted_to_free_cpus("data") as share:
            if share is not None:
                on_stage("data", "progress", f"{share:g} CPU per task: that is what is free")
            prepared = prepare_variants(spec, [apply_overrides(spec, v) if v else spec for v in variants],
                                        progress=lambda detail: on_stage("data", "progress", detail),
                                        tick=lambda detail: on_stage("data", "tick", detail),
                                        cache=DataCache.of(ws, read=data_cache))
    except KeyboardInterrupt as exc:
        raise InterruptedRun("interrupted while preparing data: nothing was trained or registered") from exc
    data = prepared[0]
    on_stage("data", "done", f"{data.rows['train']}/{data.rows['valid']}/{data.rows['test']} rows, "
             f"{len(data.preprocessing.output_columns)} features, {data.task}"
             + (f", {len(prepared)} preprocessing variants" if len(prepared) > 1 else "")
             + (f", cached ({data.cache_key})" if all(p.cached for p in prepared) else ""))
    return prepared
