"""Resource planning against a cluster whose free resources lag: a plan that fails while the cluster's
total would fit is tried again for a while.
"""

from __future__ import annotations

import time
from typing import Callable

__all__ = ["PLAN_SETTLE_S", "RISE_WAIT_S", "plan_when_settled", "risen_view"]

# Ray's view of free resources lags: a node reports the CPUs its finished tasks gave back with
# its next resource report. On the three-node test cluster (tests/integration/test_multinode.py),
# loaded, the data stage's tasks had ended but 1 of 2 CPUs showed free, and the plan failed ("the
# cluster has 1 available"). A plan that fails while the cluster's total would fit it is tried
# again for up to this long; one the total cannot fit fails at once.
PLAN_SETTLE_S = 15.0


# A plan that fits is no proof that nothing is still being given back: right after the data stage
# (1M rows, the 2-core machine, an embedded Ray) `ray.available_resources()` said 1 of 2 CPUs free
# and 0.25 s later 2. Planned on the first view, the run's 2 workers got half a CPU each, and merged
# into one process (train.in_process) they trained with 1 thread of the 2. While fewer CPUs are free
# than the cluster has, the view is read again for up to this long, until all are free.
RISE_WAIT_S = 1.0


def risen_view(available: Callable[[], dict], total: Callable[[], dict], wait_s: float = RISE_WAIT_S,
               sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> dict:
    """The free resources once CPUs given back have shown up: `available()` at once when every CPU
    of `total()` is free, else read every 0.1 s until it is, for at most `wait_s` (CPUs a Serve
    replica or another run holds stay held: the last view then)."""
    view = available()
    all_cpus = float(total().get("CPU", 0.0))
    deadline = clock() + wait_s
    while float(view.get("CPU", 0.0)) < all_cpus - 1e-9 and clock() < deadline:
        sleep(0.1)
        view = available()
    return view


def plan_when_settled(plan: Callable[[dict], object], available: Callable[[], dict], total: Callable[[], dict],
                      settle_s: float = PLAN_SETTLE_S, sleep: Callable[[float], None] = time.sleep,
                      clock: Callable[[], float] = time.monotonic, rise_s: float = RISE_WAIT_S):
    """`plan(available())` on a view whose given-back CPUs have shown up (`risen_view`, up to `rise_s`),
    retried every 0.5 s for `settle_s` while it raises ResourceError and `plan(total())` would not:
    resources still being given back. The last error otherwise."""
    from rayline.errors import ResourceError

    deadline = clock() + settle_s
    while True:
        try:
            return plan(risen_view(available, total, rise_s, sleep, clock))
        except ResourceError:
            if clock() >= deadline:
                raise
            try:
                plan(total())
            except ResourceError:
                pass
            else:
                sleep(0.5)
                continue
            raise
