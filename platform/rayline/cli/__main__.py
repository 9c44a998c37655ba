"""`python -m rayline.cli`: the `rayline` command."""

from rayline.cli import entry

entry()
