"""Every `rayline` command line in deploy/README.md parses with the real CLI: a renamed command
or option fails here, not for the first user who copies the line."""

import re
import shlex
from pathlib import Path

import pytest
import typer.main

from rayline.cli import app

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "deploy" / "README.md"


def _command_lines(text: str) -> list[str]:
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        joined = re.sub(r"\\\n\s*", " ", block)  # continuation lines
        for line in joined.splitlines():
            line = line.strip().split("  #")[0].rstrip(" &")
            if line.startswith("rayline "):
                lines.append(line)
    return lines


def _parse(args: list[str]) -> None:
    command = typer.main.get_command(app)
    ctx = command.make_context("rayline", list(args), resilient_parsing=False)
    while hasattr(command, "resolve_command"):  # a group (typer vendors its own click classes)
        # click keeps a group's subcommand and its arguments here until invoke()
        remaining = [*getattr(ctx, "_protected_args", []), *ctx.args]
        assert remaining, f"{command.name}: a group needs a subcommand"
        name, sub, rest = command.resolve_command(ctx, remaining)
        command, ctx = sub, sub.make_context(name, rest, parent=ctx)


LINES = _command_lines(DOC.read_text())


def test_the_guide_has_rayline_commands():
    assert any(line.startswith("rayline submit") for line in LINES)


@pytest.mark.parametrize("line", LINES)
def test_guide_command_parses(line):
    _parse(shlex.split(line)[1:])


def test_a_wrong_option_fails_to_parse():
    with pytest.raises(Exception, match="No such option: --no-such-option"):
        _parse(["predict", "http://127.0.0.1:8000/digits", "--no-such-option"])
    with pytest.raises(Exception, match="No such command"):
        _parse(["sumbit", "spec.yaml"])
