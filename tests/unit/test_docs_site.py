"""The documentation site: `mkdocs build --strict` succeeds (a broken link, a missing page or an
anchor that does not exist fails it), and the generated references hold every spec key and every
CLI command, counted here from the spec's pydantic models and the Typer app themselves."""

import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT / "platform")}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "WARNING" not in proc.stderr, proc.stderr[-3000:]
    return out


def _models_in(annotation) -> list:
    """The pydantic models an annotation can hold, with "[]" for a list and "<name>" for a mapping."""
    origin = typing.get_origin(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [("", annotation)]
    found = []
    for arg in typing.get_args(annotation):
        for suffix, model in _models_in(arg):
            if origin in (list, tuple):
                suffix = "[]" + suffix
            elif origin is dict:
                suffix = ".<name>" + suffix
            found.append((suffix, model))
    return found


def _spec_keys(model, prefix="") -> set:
    keys = set()
    for name, field in model.model_fields.items():
        key = f"{prefix}.{field.alias or name}" if prefix else (field.alias or name)
        keys.add(key)
        for suffix, inner in _models_in(field.annotation):
            keys |= _spec_keys(inner, key + suffix)
    return keys


def _commands(command, path):
    yield " ".join(path)
    for name, sub in (getattr(command, "commands", None) or {}).items():
        yield from _commands(sub, path + [name])


def test_the_site_builds_strictly_with_every_page(site):
    for page in ("index", "spec", "data", "running", "training", "tuning", "serving", "interop", "clusters",
                 "kubernetes", "operations", "benchmarks", "benchmark-details", "reference/spec", "reference/cli"):
        assert (site / page / "index.html").exists() or (page == "index" and (site / "index.html").exists()), page


def test_the_spec_reference_lists_every_key(site):
    from rayline.spec import PipelineSpec

    keys = _spec_keys(PipelineSpec)
    assert {"serve.canary.percent", "data.preprocess[].impute.strategy", "tune.scheduler.asha.grace_period",
            "train.workers.min"} <= keys  # the walk above reaches unions, lists and nested models
    page = (site / "reference" / "spec" / "index.html").read_text()
    missing = sorted(k for k in keys if f"<code>{k.replace('<', '&lt;').replace('>', '&gt;')}</code>" not in page)
    assert not missing, missing


def test_the_cli_reference_lists_every_command_and_option(site):
    import typer.main

    from rayline.cli import app

    root = typer.main.get_command(app)
    commands = list(_commands(root, ["rayline"]))
    assert "rayline serve deploy" in commands and "rayline jobs logs" in commands
    page = (site / "reference" / "cli" / "index.html").read_text()
    assert not [c for c in commands if f"<code>{c}</code><a class=\"headerlink\"" not in page]
    for name, command in root.commands.items():
        for param in command.params:
            for opt in getattr(param, "opts", []):
                if opt.startswith("--"):
                    assert f"<code>{opt}</code>" in page, (name, opt)
