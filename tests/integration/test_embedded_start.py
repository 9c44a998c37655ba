"""Two runs started in the same second (issue 38): both can find Ray's dashboard port 8265 free, and
the second's dashboard then fails to bind it ("Failed to start the dashboard"). The embedded start
retries on a port the OS picks.

The race is made certain, not waited for: in a subprocess, the check for a free 8265 answers a port
that a listening socket holds (as if another run bound 8265 between the check and the bind); the rest
is real: Ray starts, its dashboard fails to bind, rayline starts Ray again, and a task runs on it.
Then a start whose raylet registers too late for Ray's fixed 30 s (a loaded machine; the failure is
raised after a real start) is started again once, and stopped as `rayline run` stops it, leaving no temp
dir of its dashboard's forkserver. The first start (no --verbose) runs no log monitor; the second
(--verbose) keeps it.
"""

import os
import subprocess
import sys

from .conftest import ROOT

SCRIPT = r"""
import os, socket, sys
sys.path.insert(0, sys.argv[1])
import rayline.cluster.connection as connection

held = socket.socket()
held.bind(("127.0.0.1", 0))
held.listen()
taken = held.getsockname()[1]
free_port = connection.free_port
asked = []

def racing(host, preferred=None):
    asked.append(preferred)
    return taken if preferred == 8265 else free_port(host, preferred)

def log_monitors():
    # Processes of this node running Ray's log monitor, from the machine's process table.
    import psutil
    found = 0
    for child in psutil.Process().children(recursive=True):
        try:
            found += "log_monitor.py" in " ".join(child.cmdline())
        except psutil.Error:  # a worker that exited meanwhile
            pass
    return found

connection.free_port = racing
connection._start_embedded(1, False)
import ray

print("monitors", log_monitors())  # none: no --verbose, nothing reads worker logs live
print("asked", asked)
print("api", os.environ["RAY_API_SERVER_ADDRESS"], "taken", taken)
print("task", ray.get(ray.remote(lambda: 41 + 1).remote()))
ray.shutdown()

# A raylet that did not register within Ray's fixed 30 s: the first start raises what Ray raises then
# (ray/_private/node.py), after starting its processes; rayline stops them and starts Ray again.
connection.free_port = free_port
real_init, starts = ray.init, []

def slow_node(*args, **kwargs):
    starts.append(kwargs.get("dashboard_port"))
    real_init(*args, **kwargs)
    if len(starts) == 1:
        raise Exception("The current node timed out during startup. This could happen because some of the raylet "
                        "failed to startup or the GCS has become overloaded.")

ray.init = slow_node
connection._start_embedded(1, True)  # as `rayline run --verbose`: Ray's logs reach this terminal
print("starts", len(starts))
print("monitors2", log_monitors())
print("task2", ray.get(ray.remote(lambda: 40 + 3).remote()))
# Stopped as `rayline run` stops its own Ray: the dashboard's forkserver dir goes with it.
dirs = connection.forkserver_dirs(connection._embedded_ray_processes())
connection.Connection(address=None, embedded=True, owned=True).shutdown()
print("forkserver_dirs", len(dirs), "left", sum(os.path.exists(d) for d in dirs))
"""


def test_an_embedded_start_whose_dashboard_port_was_taken_or_whose_node_timed_out_starts_again():
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT / "platform")], capture_output=True, text=True,
                          timeout=180, env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    assert lines["asked"] == "[8265, None]", done.stdout  # the port taken, then one the OS picked
    address, taken = lines["api"].split(" taken ")
    assert not address.endswith(f":{taken}"), done.stdout  # the state API names the dashboard's new port
    assert lines["task"] == "42", done.stdout
    assert "starting it again with its dashboard on another port" in done.stderr, done.stderr
    # The node that timed out: started again, once, and it runs tasks.
    assert lines["starts"] == "2" and lines["task2"] == "43", done.stdout
    # Ray's log monitor tails the workers' logs for drivers that print them: stopped without --verbose
    # (rayline.cluster.connection.stop_log_monitor), kept with it.
    assert lines["monitors"] == "0" and lines["monitors2"] == "1", done.stdout
    assert "Ray did not start (The current node timed out during startup" in done.stderr, done.stderr
    # Its shutdown removed the temp dir (/tmp/pymp-*) of the dashboard's forkserver, which Ray's kill leaves.
    assert lines["forkserver_dirs"] == "1 left 0", done.stdout
