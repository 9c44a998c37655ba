"""Reading Serve's status: `serve.status()` against rayline's `serve_status()`, side by side, on one
local Ray with N trivial applications (what rayline's deploys poll while they wait).

    python benchmarks/serve_status.py [--apps 6] [--calls 50]

Prints each path's CPU and wall milliseconds per call, the ratio, and whether both answered the same
ServeStatus. Exit code 1 when they differ.
"""

from __future__ import annotations

import argparse
import sys
import time


def per_call(fn, calls: int) -> tuple[float, float]:
    fn()  # warm
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(calls):
        fn()
    return 1000 * (time.process_time() - cpu) / calls, 1000 * (time.perf_counter() - wall) / calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--apps", type=int, default=6)
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()

    import ray
    from ray import serve

    from rayline.ports import free_port
    from rayline.serve.details import serve_status

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": free_port()})

        @serve.deployment(ray_actor_options={"num_cpus": 0})
        class Answer:
            def __call__(self, request):
                return "ok"

        for i in range(args.apps):
            serve.run(Answer.bind(), name=f"app{i}", route_prefix=f"/app{i}")
        same = serve_status() == serve.status()
        ray_cpu, ray_wall = per_call(serve.status, args.calls)
        ours_cpu, ours_wall = per_call(serve_status, args.calls)
        print(f"{args.apps} applications, {args.calls} calls each")
        print(f"serve.status():  {ray_cpu:7.2f} ms CPU, {ray_wall:7.2f} ms wall per call")
        print(f"serve_status():  {ours_cpu:7.2f} ms CPU, {ours_wall:7.2f} ms wall per call")
        print(f"ratio (serve_status / serve.status): CPU {ours_cpu / ray_cpu:.3f}x, wall {ours_wall / ray_wall:.3f}x")
        print(f"same ServeStatus: {same}")
        return 0 if same else 1
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
