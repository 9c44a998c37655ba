"""MkDocs hooks: the two reference pages are generated at build time from the code itself.

- `reference/spec.md`: every key of the pipeline spec, from `rayline.spec_json_schema()` (the
  schema the spec's pydantic models produce), with its type, default, allowed values and the
  description the model declares. A key added to the spec appears here without anyone editing a page.
- `reference/cli.md`: every `rayline` command with its arguments and options, from the Typer app.

`mkdocs build --strict` (tests/unit/test_docs_site.py) builds the site; `spec_reference()` and
`cli_reference()` are what the test checks for every key and every command.
"""

from __future__ import annotations

import json
from typing import Any, Iterator

__all__ = ["spec_reference", "cli_reference", "spec_keys", "cli_commands", "on_files"]

SPEC_PAGE = "reference/spec.md"
CLI_PAGE = "reference/cli.md"


# ---------------------------------------------------------------- the spec


def _resolve(schema: dict, node: dict) -> dict:
    while "$ref" in node:
        node = schema["$defs"][node["$ref"].rsplit("/", 1)[1]]
    return node


def _alternatives(schema: dict, node: dict) -> list[dict]:
    """The non-null alternatives of a union (or the node itself), resolved."""
    node = _resolve(schema, node)
    options = node.get("anyOf") or node.get("oneOf")
    if not options:
        return [node]
    return [_resolve(schema, o) for o in options if o.get("type") != "null"]


def _nullable(schema: dict, node: dict) -> bool:
    node = _resolve(schema, node)
    return any(o.get("type") == "null" for o in node.get("anyOf") or node.get("oneOf") or [])


def _bounds(node: dict) -> str:
    parts = []
    for key, sign in (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"), ("exclusiveMaximum", "<")):
        if key in node:
            parts.append(f"{sign} {node[key]:g}" if isinstance(node[key], (int, float)) else f"{sign} {node[key]}")
    for key, word in (("minLength", "length ≥"), ("maxLength", "length ≤"), ("minItems", "items ≥"), ("maxItems", "items ≤")):
        if key in node:
            parts.append(f"{word} {node[key]}")
    return ", ".join(parts)


def _type_of(schema: dict, node: dict) -> str:
    """A short type: `string`, `integer ≥ 1`, `one of: a, b`, `list of string`, `object`, unions joined by `|`."""
    words = []
    for alt in _alternatives(schema, node):
        if "enum" in alt:
            words.append("one of: " + ", ".join(f"`{json.dumps(v)}`" for v in alt["enum"]))
        elif "const" in alt:
            words.append(f"`{json.dumps(alt['const'])}`")
        elif alt.get("type") == "array":
            words.append("list of " + _type_of(schema, alt.get("items", {})) if alt.get("items") else "list")
        elif alt.get("type") == "object" or "properties" in alt:
            words.append(f"object ({alt['title']})" if alt.get("properties") and alt.get("title") else "mapping")
        elif "type" in alt:
            kind = alt["type"] if isinstance(alt["type"], str) else " | ".join(alt["type"])
            bounds = _bounds(alt)
            words.append(f"{kind} {bounds}".strip())
        else:
            words.append("any")
    text = " | ".join(dict.fromkeys(words)) or "any"
    return text + (" | null" if _nullable(schema, node) else "")


def _default(node: dict, required: bool) -> str:
    if required:
        return "required"
    if "default" in node:
        return f"`{json.dumps(node['default'])}`"
    return "—"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _walk(schema: dict, node: dict, path: str, seen: tuple = ()) -> Iterator[tuple[str, dict, bool]]:
    """(key path, property schema, required) for every key under `node`, depth first."""
    for alt in _alternatives(schema, node):
        title = alt.get("title")
        if title in seen:  # a model inside itself: listed once
            continue
        if alt.get("type") == "array" and alt.get("items"):
            yield from _walk(schema, alt["items"], path + "[]", seen)
            continue
        properties = alt.get("properties") or {}
        required = set(alt.get("required") or ())
        for name, prop in properties.items():
            key = f"{path}.{name}" if path else name
            yield key, prop, name in required
            yield from _walk(schema, prop, key, seen + ((title,) if title else ()))
        extra = alt.get("additionalProperties")
        if isinstance(extra, dict) and extra:
            key = f"{path}.<name>" if path else "<name>"
            yield key, extra, False
            yield from _walk(schema, extra, key, seen + ((title,) if title else ()))


def spec_keys() -> list[str]:
    """Every key path of the spec (`serve.canary.percent`, `data.preprocess[].impute.columns`)."""
    from rayline import spec_json_schema

    schema = spec_json_schema()
    return list(dict.fromkeys(key for key, _, _ in _walk(schema, schema, "")))


def spec_reference() -> str:
    from rayline import spec_json_schema

    schema = spec_json_schema()
    lines = [
        "# Spec reference",
        "",
        "Every key of the pipeline spec, generated from the spec's own models when the site is built",
        "(`rayline.spec_json_schema()`), so it cannot drift from what `rayline run` accepts. A `[]` in a",
        "key is a list item; `<name>` is a key you choose. Unknown keys are refused with a message",
        "naming the key and what is allowed. The [guide to the spec](../spec.md) explains the sections.",
        "",
    ]
    rows: dict[str, list[str]] = {}
    for key, prop, required in _walk(schema, schema, ""):
        section = key.split(".")[0].split("[")[0] if "." in key else "(top level)"
        node = _resolve(schema, prop)
        description = prop.get("description") or node.get("description") or ""
        rows.setdefault(section, []).append(
            f"| `{key}` | {_cell(_type_of(schema, prop))} | {_cell(_default(prop, required))} | {_cell(description)} |")
    for section, body in rows.items():
        lines += [f"## {section}", "", "| key | type | default | description |", "|---|---|---|---|", *dict.fromkeys(body), ""]
    return "\n".join(lines)


# ---------------------------------------------------------------- the CLI


def _commands(command, path: list[str]) -> Iterator[tuple[list[str], Any]]:
    yield path, command
    for name, sub in sorted((getattr(command, "commands", None) or {}).items()):
        if not getattr(sub, "hidden", False):
            yield from _commands(sub, path + [name])


def _root_command():
    import typer.main

    from rayline.cli import app

    return typer.main.get_command(app)


def cli_commands() -> list[str]:
    """Every command line prefix: `rayline`, `rayline run`, `rayline serve deploy`, ..."""
    return [" ".join(path) for path, _ in _commands(_root_command(), ["rayline"])]


def _param_row(param) -> str:
    if param.param_type_name == "argument":
        name = f"`{(param.metavar or param.name).upper()}`"
        default = "required" if param.required else f"`{param.default}`" if param.default not in (None, ()) else "—"
    else:
        name = ", ".join(f"`{o}`" for o in param.opts + param.secondary_opts)
        if getattr(param, "is_flag", False):
            default = "off" if not param.default else "on"
        elif param.required:
            default = "required"
        else:
            default = f"`{param.default}`" if param.default not in (None, (), []) else "—"
    return f"| {name} | {_cell(default)} | {_cell(param.help or '')} |"


def cli_reference() -> str:
    lines = [
        "# CLI reference",
        "",
        "Every `rayline` command, generated from the commands themselves when the site is built; "
        "`rayline COMMAND --help` prints the same. Exit codes: 0 done; 1 failed (training, the "
        "registry, serving, the cluster); 2 bad input (the spec, the data, an argument); 3 the cluster "
        "cannot fit what a stage needs; 130 interrupted (Ctrl-C or SIGTERM while training or "
        "following a job; a serving `rayline run` stopped by SIGTERM drains and exits 0).",
        "",
    ]
    for path, command in _commands(_root_command(), ["rayline"]):
        lines += [f"## `{' '.join(path)}`", ""]
        if command.help:
            lines += [command.help.strip(), ""]
        subcommands = getattr(command, "commands", None)
        if subcommands:
            lines += ["| command | what it does |", "|---|---|"]
            for name, sub in sorted(subcommands.items()):
                if not getattr(sub, "hidden", False):
                    summary = (sub.help or "").strip().split("\n\n")[0]
                    anchor = "-".join(path + [name])
                    lines.append(f"| [`{' '.join(path + [name])}`](#{anchor}) | {_cell(summary)} |")
            lines.append("")
        params = [p for p in command.params if not getattr(p, "hidden", False) and p.name != "help"]
        if params:
            lines += ["| argument or option | default | what it is |", "|---|---|---|", *map(_param_row, params), ""]
    return "\n".join(lines)


# ---------------------------------------------------------------- the MkDocs hook

# Guides that live beside what they describe (and are tested there: tests/unit/test_deploy_docs.py
# parses every command line of deploy/README.md), rendered into the site as they are.
REPO_PAGES = {"kubernetes.md": "deploy/README.md", "benchmark-details.md": "benchmarks/README.md"}


def on_files(files, config):
    """Add the generated pages and the repository's guides to the build (never written into docs/)."""
    from pathlib import Path

    from mkdocs.structure.files import File

    for page, make in ((SPEC_PAGE, spec_reference), (CLI_PAGE, cli_reference)):
        files.append(File.generated(config, page, content=make()))
    root = Path(config.config_file_path).parent
    for page, source in REPO_PAGES.items():
        files.append(File.generated(config, page, content=(root / source).read_text(encoding="utf-8")))
    return files
