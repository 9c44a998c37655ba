"""Modules that moved from the package's top level into their stage's package still import by their
old names (rayline/__init__.py's `_MOVED`), as the same module objects, and only when asked for.

A version registered before the move carries a copy of the old pyfunc_model.py, which imports
`rayline.model` and `rayline.pyfunc`; Tune's saved sweep state pickles its callbacks by module name.
Each check runs in a fresh interpreter: an alias must work on first import, not only after the new
module is already loaded.
"""

import json
import subprocess
import sys
from pathlib import Path

import rayline

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "platform" / "rayline"


def _run(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(PACKAGE.parent), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


def test_each_old_name_is_its_new_module_and_leaves_no_file_at_the_top_level():
    for old, new in rayline._MOVED.items():
        assert old.count(".") == 1 and not (PACKAGE / f"{old.split('.')[1]}.py").exists(), old
        assert (PACKAGE / (new.removeprefix("rayline.").replace(".", "/") + ".py")).is_file(), new
    code = f"""
import importlib, json, sys
moved = {dict(rayline._MOVED)!r}
out = {{}}
for old, new in moved.items():
    module = importlib.import_module(old)
    out[old] = [module is sys.modules[new] is sys.modules[old], module.__name__, module.__spec__.name,
                getattr(sys.modules["rayline"], old.split(".")[1]) is module]
print(json.dumps(out))
"""
    found = json.loads(_run(code))
    for old, new in rayline._MOVED.items():
        assert found[old] == [True, new, new, True], (old, found[old])


def test_the_old_pyfunc_model_file_s_imports_work():
    # What every version registered before the move runs in load_context and predict.
    code = """
from rayline.model import PYFUNC_ARTIFACT, Predictor
from rayline.pyfunc import predict_frame
import rayline.inference.predictor as predictor, rayline.registry.pyfunc as pyfunc
print(Predictor is predictor.Predictor and PYFUNC_ARTIFACT == predictor.PYFUNC_ARTIFACT
      and predict_frame is pyfunc.predict_frame)
"""
    assert _run(code) == "True"


def test_a_pickle_that_names_an_old_module_loads_its_class():
    code = """
import pickle
from rayline.registry.lineage import Lineage
print(pickle.loads(b"crayline.lineage\\nLineage\\n.") is Lineage)
"""
    assert _run(code) == "True"


def test_the_old_evaluation_module_s_names_are_the_evaluation_package_s():
    code = """
import rayline.evaluation as old, rayline.evaluation.metrics as new
print(all(getattr(old, n) is getattr(new, n) for n in new.__all__) and set(old.__all__) == set(new.__all__))
"""
    assert _run(code) == "True"


def test_importing_rayline_loads_no_moved_module():
    code = f"""
import sys, rayline
names = set({sorted(set(rayline._MOVED) | set(rayline._MOVED.values()))!r})
print(sorted(m for m in sys.modules if m in names or m.startswith("rayline.evaluation")
             or m.split(".")[0] in ("pandas", "mlflow", "ray", "torch", "httpx")))
"""
    assert _run(code) == "[]"
