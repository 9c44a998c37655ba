"""Native libraries' fd-2 lines go to rayline's log, not the terminal (rayline/inference/native_stderr.py)."""

import logging
import os
import subprocess
import sys

import pytest

from rayline.inference.native_stderr import native_stderr_to_log

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_what_is_written_to_fd_2_in_the_block_is_logged_and_fd_2_is_back_after(capfd, caplog):
    caplog.set_level(logging.INFO, logger="rayline.somelib")
    print("before", file=sys.stderr, flush=True)
    with native_stderr_to_log("rayline.somelib", "somelib"):
        os.write(2, b"I0000 00:00:1.0 port.cc:153] a native line\n\n")  # as C++ code writes: past sys.stderr
        os.write(2, b"a second line\n")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "before\nafter\n"
    assert [(r.name, r.getMessage()) for r in caplog.records] == [
        ("rayline.somelib", "somelib: I0000 00:00:1.0 port.cc:153] a native line"),
        ("rayline.somelib", "somelib: a second line")]


def test_an_error_in_the_block_propagates_and_what_it_wrote_is_still_logged(capfd, caplog):
    caplog.set_level(logging.INFO, logger="rayline.somelib")
    with pytest.raises(ImportError, match="no such library"):
        with native_stderr_to_log("rayline.somelib", "somelib"):
            os.write(2, b"E0000 failed to load\n")
            raise ImportError("no such library")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n"
    assert [r.getMessage() for r in caplog.records] == ["somelib: E0000 failed to load"]


def test_tensorflow_imported_by_rayline_prints_nothing_on_stderr():
    """The real library in a fresh process (TensorFlow is imported once per process), along the driver's
    path in `rayline run`: the trainer class, the versions registered, a model run. Before, its import,
    tf_keras's and the first device listing printed eight absl lines on stderr (oneDNN, cuda drivers,
    cuInit, the CPU feature guard); now stderr is empty and rayline's log has them."""
    code = ("import logging, sys\n"
            "logging.basicConfig(stream=sys.stdout, level=logging.INFO, format='%(name)s|%(message)s')\n"
            "from rayline.train.backend import load_backend\n"
            "backend = load_backend('tensorflow')\n"
            "backend.trainer_class()\n"  # the driver's first import: Ray's TensorflowTrainer imports TensorFlow
            "print(sorted(backend.versions()))\n"  # registration
            "from rayline.inference.tensorflow_model import import_tensorflow\n"
            "tf = import_tensorflow()\n"
            "import tf_keras\n"
            "model = tf_keras.Sequential([tf_keras.layers.Dense(2)])\n"
            "print('ran', model(tf.constant([[1.0, 2.0]])).shape)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
    env["PYTHONPATH"] = os.path.join(ROOT, "platform") + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr == ""
    logged = [line for line in proc.stdout.splitlines() if line.startswith("rayline.tensorflow|tensorflow: ")]
    # Which lines TensorFlow prints depends on the machine: oneDNN's notice on CPUs where it turns oneDNN on
    # (AVX-512 ones), the CPU feature guard where the CPU has instructions the wheel was not built for (AVX2
    # FMA), the CUDA stub's where no GPU driver is; absl's own "before InitializeLog" warning precedes any.
    # On 2026-12-07 an AVX2 box printed no oneDNN line, and a check for that line alone failed there.
    banner = ("oneDNN custom operations", "cpu_feature_guard.cc", "cudart_stub.cc", "absl::InitializeLog()")
    assert any(marker in line for line in logged for marker in banner), proc.stdout[-3000:]
    assert "['tensorflow', 'tf_keras']" in proc.stdout and "ran (1, 2)" in proc.stdout
