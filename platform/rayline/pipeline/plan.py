"""Resource planning against a cluster whose free resources lag: a plan that fails while the cluster's
total would fit is tried again for a while.
"""

from __future__ import annotations

import time
from typing import Callable

__all__ = ["PLAN_SETTLE_S", "plan_when_settled"]

# Ray's view of free resources lags: a node reports the CPUs its finished tasks gave back with
# its next resource report. On the three-node test cluster (tests/integration/test_multinode.py),
# loaded, the data stage's tasks had ended but 1 of 2 CPUs showed free, and the plan failed ("the
# cluster has 1 available"). A plan that fails while the cluster's total would fit it is tried
# again for up to this long; one the total cannot fit fails at once.
PLAN_SETTLE_S = 15.0


def plan_when_settled(plan: Callable[[dict], object], available: Callable[[], dict], total: Callable[[], dict],
                      settle_s: float = PLAN_SETTLE_S, sleep: Callable[[float], None] = time.sleep,
                      clock: Callable[[], float] = time.monotonic):
    """`plan(available())`, retried every 0.5 s for `settle_s` while it raises ResourceError and
    `plan(total())` would not: resources still being given back. The last error otherwise."""
    from rayline.errors import ResourceError

    deadline = clock() + settle_s
    while True:
        try:
            return plan(available())
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
