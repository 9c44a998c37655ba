"""Server (c) of the serving benchmark: rayline's own HTTP app, without Ray.

The exact FastAPI app every Serve replica runs (`rayline.serve.http.build_http_app`: the
request schema generated from training, raw-bytes validation, compiled preprocessing, the
model, the response) on one uvicorn worker, with no Ray Serve in front and no batching. Set
against (a), it is what rayline's own code costs per request; set against (b), what the Ray
Serve hop costs.

    python benchmarks/rayline_app_server.py --workspace W --port 8822 [--no-monitoring]

With `--no-monitoring` it is server (f): the same app with serve.monitoring off, so (c)/(f) is what
the live drift monitoring (rayline/monitoring/live.py) costs a request.
"""

from __future__ import annotations

import argparse

__all__ = ["main"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--model", default="digits")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8822)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1, as a Serve replica)")
    parser.add_argument("--no-monitoring", action="store_true", help="serve.monitoring: false (default: on, as a "
                                                                    "replica with the default spec)")
    args = parser.parse_args()

    import torch
    import uvicorn

    import rayline
    from rayline.serve.http import build_http_app

    torch.set_num_threads(args.threads)
    predictor = rayline.load_model(args.model, workspace=args.workspace)
    from rayline.monitoring.live import monitor_predictor
    from rayline.spec import MonitoringSpec

    # The replica's monitor with the default spec; its window stays in this process (no Ray's KV).
    monitor = monitor_predictor(predictor, str(predictor.version), MonitoringSpec(enabled=not args.no_monitoring),
                                kv=False)
    app = build_http_app(predictor, str(predictor.version), monitor=monitor)
    uvicorn.run(app, host=args.host, port=args.port, workers=1, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
