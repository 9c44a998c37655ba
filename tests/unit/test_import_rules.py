"""The package's layout rules, read from its own import statements (at module level and inside
functions: an import inside a function hides a loop, it does not remove it):

- no import cycle among rayline's modules;
- serving (`rayline.serve`) and the inference modules (`rayline.inference`, the offline predictor
  `rayline.inference.predictor` among them) reach nothing of `rayline.train`, directly or through any
  other module: serving a model needs no training code;
- no module imports another module's private (`_name`) names;
- and, run for real in a fresh interpreter, importing the serving side loads no `rayline.train` module.
"""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "platform" / "rayline"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The module an imported name lives in: `rayline.serve.app.build_app` -> `rayline.serve.app`."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in MODULES:
            return ".".join(parts[:i])
    return None


def _imports(module: str) -> list[tuple[str, str, int]]:
    """(imported module, imported name or "", line) for every rayline import in `module`."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(target, "", node.lineno) for a in node.names if (target := _resolve(a.name))]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            if not base.startswith("rayline"):
                continue
            for a in node.names:
                target = _resolve(f"{base}.{a.name}")
                if target and target != base and target in MODULES and f"{base}.{a.name}" == target:
                    found.append((target, "", node.lineno))  # `from pkg import submodule`
                elif _resolve(base):
                    found.append((_resolve(base), a.name, node.lineno))
    return [(t, n, line) for t, n, line in found if t != module]


GRAPH = {m: _imports(m) for m in MODULES}


def _cycle() -> list[str] | None:
    """One import cycle (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str):
        state[m] = 1
        path.append(m)
        for target, _, _ in GRAPH[m]:
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (found := visit(target)):
                return found
        state[m] = 2
        path.pop()
        return None

    for m in sorted(MODULES):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_walk_sees_imports_inside_functions_and_relative_ones():
    # inference/predictor.py imports rayline.inference inside Predictor.__init__; the package re-exports the spec.
    assert "rayline.inference" in {t for t, _, _ in GRAPH["rayline.inference.predictor"]}
    assert "rayline.spec" in {t for t, _, _ in GRAPH["rayline"]}
    assert len(MODULES) > 90 and sum(map(len, GRAPH.values())) > 300


def test_no_import_cycle_among_rayline_modules():
    cycle = _cycle()
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def _reach(start: str) -> dict[str, str]:
    """Every module `start` reaches through imports -> the module that imports it on the way."""
    seen, todo = {start: ""}, [start]
    while todo:
        m = todo.pop()
        for target, _, _ in GRAPH[m]:
            if target not in seen:
                seen[target] = m
                todo.append(target)
    return seen


def test_serving_reaches_no_training_code():
    starts = [m for m in MODULES if m.startswith(("rayline.serve", "rayline.inference"))]
    assert "rayline.serve.app" in starts and "rayline.inference.torch_model" in starts
    assert "rayline.inference.predictor" in starts  # the offline Predictor, what every replica runs
    for start in starts:
        reached = _reach(start)
        training = sorted(m for m in reached if m.startswith("rayline.train"))
        if training:
            chain, m = [], training[0]
            while m:
                chain.append(m)
                m = reached[m]
            raise AssertionError(f"{start} reaches {training}: " + " <- ".join(chain))


def test_no_module_imports_another_modules_private_names():
    private = [f"{m}:{line} imports {name} from {target}" for m, edges in GRAPH.items() for target, name, line in edges
               if name.startswith("_") and not name.startswith("__")]
    assert not private, private


def test_importing_the_serving_side_loads_no_training_module():
    code = ("import sys; import rayline.serve.app, rayline.serve.router, rayline.serve.oip, rayline.serve.versions, "
            "rayline.inference.predictor, rayline.inference, rayline.inference.torch_model, "
            "rayline.inference.xgboost_model, "
            "rayline.inference.tensorflow_model; "
            "print(sorted(m for m in sys.modules if m.startswith('rayline.train')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(PACKAGE.parent), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]", proc.stdout


def test_every_name_imported_from_rayline_exists():
    """An import inside a function runs only when that function does: a name moved to another module
    would fail there, at a user's command, not at import. Each one is checked here."""
    import importlib

    missing = []
    for module, edges in GRAPH.items():
        for target, name, line in edges:
            if name and name != "*" and not hasattr(importlib.import_module(target), name) \
                    and f"{target}.{name}" not in MODULES:
                missing.append(f"{module}:{line} imports {name} from {target}")
    assert not missing, missing
