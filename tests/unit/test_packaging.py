"""Layout and import hygiene."""

import subprocess
import sys
from pathlib import Path

import rayline

ROOT = Path(__file__).resolve().parents[2]


def test_platform_source_root_does_not_shadow_stdlib_platform():
    assert not (ROOT / "platform" / "__init__.py").exists()
    proc = subprocess.run([sys.executable, "-c", "import platform; print(platform.__file__)"],
                          cwd=ROOT, capture_output=True, text=True, check=True)
    assert "lib/python" in proc.stdout and str(ROOT / "platform") not in proc.stdout


def test_cli_help_imports_no_framework_or_ray():
    code = ("import sys; from typer.testing import CliRunner; from rayline.cli import app; "
            "r = CliRunner().invoke(app, ['--help']); assert r.exit_code == 0, r.output; "
            "print(sorted(m for m in ('torch', 'tensorflow', 'xgboost', 'ray', 'mlflow') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert proc.stdout.strip() == "[]"


def test_public_api_all_is_complete():
    public = {name for name in dir(rayline) if not name.startswith("_") and name not in {"annotations", "errors", "spec", "train", "data"}}
    public = {n for n in public if not isinstance(getattr(rayline, n), type(rayline))}
    assert public <= set(rayline.__all__), public - set(rayline.__all__)
    for name in rayline.__all__:
        assert hasattr(rayline, name)
