"""Connecting to Ray: an address, RAY_ADDRESS, a head from `rayline cluster up`, or embedded.

`rayline cluster up` starts a local head with `ray start --head` that outlives the CLI and
records its address in the workspace; `connect` finds it automatically.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from rayline.errors import ClusterError
from rayline.workspace import Workspace

__all__ = ["Connection", "connect", "cluster_up", "cluster_down", "cluster_status", "quiet_ray"]

_TOKEN = Path.home() / ".ray" / "auth_token"


@dataclass
class Connection:
    address: str | None  # None: embedded in this process
    embedded: bool
    owned: bool  # True when this call started Ray and should shut it down

    def shutdown(self) -> None:
        import ray

        if self.owned and ray.is_initialized():
            try:
                from ray import serve

                serve.shutdown()
            except Exception:
                pass  # Serve was never started
            ray.shutdown()


def quiet_ray() -> None:
    """Keep Ray's own progress output off the user's terminal; rayline shows its own."""
    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("RAY_TRAIN_ENABLE_V2_MIGRATION_WARNINGS", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")


def _recorded_head(ws: Workspace) -> str | None:
    try:
        info = json.loads(ws.cluster_file.read_text())
    except (OSError, ValueError):
        return None
    return info.get("address")


def _enable_token_auth() -> None:
    # Ray 2.60 heads started with `ray start` require a token; local drivers read it from ~/.ray.
    if _TOKEN.exists() and not os.environ.get("RAY_AUTH_TOKEN"):
        os.environ.setdefault("RAY_AUTH_MODE", "token")


def connect(ws: Workspace, address: str | None = None, *, num_cpus: int | None = None, verbose: bool = False) -> Connection:
    """Join a running cluster when one is named or recorded; else start an embedded Ray."""
    import ray

    if ray.is_initialized():
        return Connection(address=None, embedded=False, owned=False)
    quiet_ray()
    address = address or os.environ.get("RAY_ADDRESS") or _recorded_head(ws)
    try:
        if address:
            _enable_token_auth()
            ray.init(address=address, log_to_driver=verbose, namespace="rayline")
            return Connection(address=address, embedded=False, owned=True)
        # The dashboard hosts Ray's state API, which Train V2 uses to free the placement
        # groups of trials Tune stops early; without it those CPUs leak.
        ray.init(num_cpus=num_cpus, include_dashboard=True, dashboard_host="127.0.0.1", log_to_driver=verbose, namespace="rayline",
                 configure_logging=True, logging_level="WARNING")
    except ConnectionError as exc:
        raise ClusterError(f"cannot reach a Ray cluster at {address}: {exc} (start one with `rayline cluster up`)") from None
    except Exception as exc:
        raise ClusterError(f"cannot start Ray{' at ' + address if address else ''}: {str(exc).splitlines()[0]}") from None
    return Connection(address=None, embedded=True, owned=True)


def _ray_cli() -> str:
    exe = shutil.which("ray", path=os.path.dirname(sys.executable)) or shutil.which("ray")
    if not exe:
        raise ClusterError("the `ray` command is not installed (pip install 'ray[default]')")
    return exe


def cluster_up(ws: Workspace, port: int = 6379, num_cpus: int | None = None) -> dict:
    ws.ensure()
    existing = _recorded_head(ws)
    if existing and cluster_status(ws).get("alive"):
        return {"address": existing, "started": False}
    cmd = [_ray_cli(), "start", "--head", f"--port={port}", "--disable-usage-stats", "--include-dashboard=true",
           "--dashboard-host=127.0.0.1", "--node-ip-address=127.0.0.1"]
    if num_cpus:
        cmd.append(f"--num-cpus={num_cpus}")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    if proc.returncode != 0:
        raise ClusterError(f"`ray start --head` failed: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
    address = f"127.0.0.1:{port}"
    info = {"address": address, "dashboard": "http://127.0.0.1:8265"}
    tmp = ws.cluster_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(info))
    os.replace(tmp, ws.cluster_file)
    return {**info, "started": True}


def cluster_down(ws: Workspace) -> bool:
    if not _recorded_head(ws):
        return False
    subprocess.run([_ray_cli(), "stop", "--force"], capture_output=True, text=True, timeout=120)
    ws.cluster_file.unlink(missing_ok=True)
    return True


def cluster_status(ws: Workspace) -> dict:
    address = _recorded_head(ws)
    if not address:
        return {"alive": False, "address": None}
    _enable_token_auth()
    proc = subprocess.run([_ray_cli(), "status", f"--address={address}"], capture_output=True, text=True, timeout=60)
    return {"alive": proc.returncode == 0, "address": address, "detail": proc.stdout.strip()}
