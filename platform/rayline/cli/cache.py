"""`rayline cache list|prune`: the workspace's data cache."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from rayline.cli.apps import cache_app
from rayline.cli.options import WorkspaceOpt, open_workspace
from rayline.cli.render import duration_s, mib, when
from rayline.console import console
from rayline.errors import SpecError


@cache_app.command("list")
def cache_list(workspace: Optional[Path] = WorkspaceOpt,
               output: str = typer.Option("table", "--output", "-o", help="table | json")) -> None:
    """The data cache's entries, oldest first: key, pipeline, source, rows, size, last used; and their total size."""
    from rayline.data.cache import DataCache

    if output not in ("table", "json"):
        raise SpecError([f"--output: unknown format (got {output!r}; allowed: table, json)"])
    ws = open_workspace(workspace)
    cache = DataCache.of(ws)
    entries = cache.entries()
    rows = []
    for entry in entries:
        meta = entry.meta
        rows.append({"key": entry.key, "pipeline": meta.get("pipeline", "?"), "source": str(meta.get("source", "?")),
                     "rows": sum((meta.get("rows") or {}).values()), "bytes": entry.bytes,
                     "created": when(entry.created * 1000), "last_used": when(entry.last_used * 1000),
                     "broken": bool(meta.get("broken"))})
    total = sum(r["bytes"] for r in rows)
    if output == "json":
        print(json.dumps({"root": str(cache.root), "entries": rows, "bytes": total}, indent=1))
        return
    table = Table(title=f"data cache {cache.root}", show_header=True)
    for col in ("key", "pipeline", "source", "rows", "size", "created", "last used"):
        table.add_column(col, justify="right" if col in ("rows", "size") else "left")
    for r in rows:
        table.add_row(r["key"] + (" (broken)" if r["broken"] else ""), r["pipeline"], r["source"], f"{r['rows']:,}",
                      mib(r["bytes"]), r["created"], r["last_used"])
    console.print(table)
    console.print(f"{len(rows)} entries, {mib(total)} in all; `rayline cache prune --older-than 7d` removes "
                  "entries not used for a week")


@cache_app.command("prune")
def cache_prune(workspace: Optional[Path] = WorkspaceOpt,
                older_than: Optional[str] = typer.Option(None, "--older-than", help="Remove entries last used longer "
                                                         "ago than this (30m, 12h, 7d); without it, every entry."),
                ) -> None:
    """Remove data cache entries (all, or those not used for a while); runs that need them recompute them."""
    from rayline.data.cache import DataCache

    seconds = duration_s(older_than) if older_than is not None else None
    ws = open_workspace(workspace)
    cache = DataCache.of(ws)
    sizes = {e.key: e.bytes for e in cache.entries()}  # before: removed entries have no size after
    removed = cache.prune(seconds)
    left = cache.entries()
    console.print(f"removed {len(removed)} entr{'y' if len(removed) == 1 else 'ies'} "
                  f"({mib(sum(sizes.get(e.key, 0) for e in removed))}); {len(left)} left, "
                  f"{mib(sum(sizes.get(e.key, 0) for e in left))}")
