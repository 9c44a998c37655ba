"""rayline/train/preload.py: `rayline run` starts importing the framework that the catalog marks
(rayline.frameworks.BackendInfo.preload) on a thread of its own, before it connects to Ray.

In a fresh interpreter (pytest's own has imported every framework already)."""

import json
import subprocess
import sys

SCRIPT = r"""
import dataclasses, json, sys, threading
from rayline.frameworks import BACKENDS
from rayline.train.preload import preload_framework

out = {"before": "xgboost" in sys.modules}
for framework in ("torch", "tensorflow"):
    out[framework] = [preload_framework(framework) is None, framework in sys.modules]
thread = preload_framework("xgboost")
out["thread"] = thread.name if thread else None
out["daemon"] = bool(thread and thread.daemon)
thread.join(120)
out["after"] = "xgboost" in sys.modules and hasattr(sys.modules["xgboost"], "train")
out["again"] = preload_framework("xgboost") is None  # imported: nothing to start
errors = []
threading.excepthook = lambda args: errors.append(repr(args.exc_value))
BACKENDS["xgboost"] = dataclasses.replace(BACKENDS["xgboost"], preload="rayline_no_such_library")
failing = preload_framework("xgboost")
failing.join(60)
out["failing"] = [failing.is_alive(), errors]
print(json.dumps(out))
"""


def test_only_the_marked_framework_is_imported_in_the_background_and_a_failure_stays_there():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["before"] is False  # nothing imported xgboost before the preload did
    # torch's import did not pay (frameworks.py says the measurement); TensorFlow never trains in the driver.
    assert out["torch"] == [True, False] and out["tensorflow"] == [True, False]
    assert out["thread"] == "rayline-import-xgboost" and out["daemon"] is True
    assert out["after"] is True and out["again"] is True
    assert out["failing"] == [False, []]  # the import's failure is the run's to report, where it imports it
    assert "Traceback" not in done.stderr
