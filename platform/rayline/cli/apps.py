"""The `rayline` Typer app and its command groups (cluster, serve, cache, jobs, models)."""

from __future__ import annotations

from typing import Optional

import typer
from typer.core import TyperGroup


# When `rayline.cli.main` last began (time.time()): `rayline run --timings` counts the CLI's own start
# from here when the process did not start for this command (a test or a notebook calling main in process).
ENTERED_AT = 0.0


app = typer.Typer(
    name="rayline",
    help="One YAML spec to a served model: Ray Data -> Ray Train -> Ray Tune -> MLflow -> Ray Serve.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


cluster_app = typer.Typer(help="A local Ray head on this machine that outlives the CLI.", no_args_is_help=True)


app.add_typer(cluster_app, name="cluster")


serve_app = typer.Typer(help="Models served by Ray Serve on the connected cluster.", no_args_is_help=True)


app.add_typer(serve_app, name="serve")


cache_app = typer.Typer(help="The workspace's data cache: data stages kept to be read back, not recomputed.",
                        no_args_is_help=True)


app.add_typer(cache_app, name="cache")


retrain_app = typer.Typer(help="The retrain loops that keep served models current (the spec's retrain section).",
                          no_args_is_help=True)


app.add_typer(retrain_app, name="retrain")


jobs_app = typer.Typer(help="Ray Jobs on a cluster, through its Jobs API (the dashboard's address).", no_args_is_help=True)


app.add_typer(jobs_app, name="jobs")


class _ListByDefault(TyperGroup):
    """A group whose `list` command is also its default: `rayline models [NAME] [-o json]` is
    `rayline models list [NAME] [-o json]`, as it was before `models` had subcommands, and
    `rayline models show NAME` runs `show`. The first argument that is not an option (nor an
    option's value) picks the command, so `rayline models -w WS show NAME` works too; a model
    named like a command is listed with `rayline models list NAME`."""

    default = "list"

    def parse_args(self, ctx, args):
        first = self._first_positional(args)
        if first is not None and args[first] in self.commands:
            args = [args[first], *args[:first], *args[first + 1:]]
        elif args != ["--help"]:
            args = [self.default, *args]
        return super().parse_args(ctx, args)

    def _first_positional(self, args) -> Optional[int]:
        takes_value = {opt for cmd in self.commands.values() for p in cmd.params
                       if p.param_type_name == "option" and not p.is_flag for opt in p.opts}
        i = 0
        while i < len(args):
            arg = args[i]
            if arg == "--":
                return None  # what follows is a NAME, whatever it reads
            if not arg.startswith("-") or arg == "-":
                return i
            i += 2 if arg in takes_value else 1
        return None


models_app = typer.Typer(
    cls=_ListByDefault,
    help="Registered models: `rayline models [NAME]` lists them with their versions and test metrics (the same as "
         "`rayline models list [NAME]`); `rayline models show NAME [--version N]` prints a version's lineage.")


app.add_typer(models_app, name="models")
