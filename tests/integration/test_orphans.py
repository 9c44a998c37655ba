"""A killed Train controller's placement group is freed (rayline/cluster/orphans.py).

Ray keeps a placement group made by a non-detached actor until that actor and its job are
both dead. A Ray Train controller killed with its Tune trial (an ASHA stop as a sweep ended)
left one holding 0.99 of the 2 CPUs for the rest of a CI session: the next pipeline's Ray
Data read waited 15 minutes for a CPU and every later module waited for CPUs to come back.
Here the leak is made as Ray makes it, by killing a real actor that holds a group.
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.integration.conftest import run

IRIS = {"format": "sklearn", "name": "iris"}


def _state(pg) -> str:
    import ray

    return ray.util.placement_group_table(pg)["state"]


@pytest.mark.timeout(240)  # without the release the read below waits for a CPU forever: fail, not hang
def test_a_killed_controllers_placement_group_is_freed_and_the_next_run_gets_its_cpus(ray_session, ws):
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    from rayline.cluster.orphans import orphaned_placement_groups
    from rayline.spec import parse_spec

    @ray.remote(num_cpus=0)
    class Controller:  # stands in for Ray Train's controller: it makes the worker group's placement group
        def make(self, cpus):
            self.pg = placement_group([{"CPU": cpus}])
            ray.get(self.pg.ready(), timeout=60)
            return self.pg

    # A run that just ended keeps releasing orphans for a few seconds (rayline.cluster.orphans.sweep_in_background):
    # it would free this test's leak before the test could see Ray keep it.
    for thread in threading.enumerate():
        if thread.name == "rayline-orphan-sweep":
            thread.join(30)
    total = ray.cluster_resources()["CPU"]
    mine = placement_group([{"CPU": 0.1}])  # the driver's own: never an orphan
    ray.get(mine.ready(), timeout=60)
    alive = Controller.remote()  # a live actor's: in use
    alive_pg = ray.get(alive.make.remote(0.1))
    killed = Controller.remote()
    leaked = ray.get(killed.make.remote(total - 0.5))  # all but half a CPU: no read task (1 CPU) fits
    ray.kill(killed)
    try:
        time.sleep(2)
        # What Ray does by itself: the killed actor's group stays, holding its CPUs.
        assert _state(leaked) == "CREATED" and ray.available_resources().get("CPU", 0) < 1
        assert orphaned_placement_groups() == [leaked.id.hex()]

        raw = {"name": "orphans-iris", "data": {"source": IRIS, "label": "target"}, "task": "classification",
               "model": {"framework": "xgboost", "kind": "gbdt", "params": {"max_depth": 2, "num_boost_round": 4}},
               # A Train worker group, whose CPUs the leaked group held (one in process would need none).
               "train": {"workers": 1, "epochs": 1, "in_process": "never"}}
        summary = run(parse_spec(raw), ws, deploy=False)
        assert summary.version
        assert _state(leaked) == "REMOVED"
        assert _state(mine) == "CREATED" and _state(alive_pg) == "CREATED"  # nobody else's group was touched
        assert orphaned_placement_groups() == []
    finally:
        for pg in (leaked, mine):
            if _state(pg) != "REMOVED":
                remove_placement_group(pg)
        ray.kill(alive)
        from rayline.cluster.orphans import release_orphaned_placement_groups

        deadline = time.monotonic() + 30
        while _state(alive_pg) != "REMOVED" and time.monotonic() < deadline:  # its actor is dead now: an orphan
            release_orphaned_placement_groups()
            time.sleep(0.5)
        assert _state(alive_pg) == "REMOVED"
