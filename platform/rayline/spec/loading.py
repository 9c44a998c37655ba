"""From a spec file to a validated `PipelineSpec`: read the file, load its YAML, validate, resolve paths.

Everything that can go wrong on the way is a `SpecError` naming the file: a missing,
unreadable, binary or oversized file, YAML that does not parse or abuses aliases, and
every invalid value (all problems at once).
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rayline.errors import SpecError
from rayline.spec.pipeline_spec import PipelineSpec
from rayline.spec.assign import set_paths
from rayline.spec.problems import Problem, SpecProblem, from_validation_error
from rayline.spec.yaml_safe import load_yaml

__all__ = ["MAX_SPEC_BYTES", "read_spec_text", "parse_spec", "load_spec"]

# pipelines/*.yaml are under 2 KB; pure-Python PyYAML reads 1 MiB in a few seconds.
MAX_SPEC_BYTES = 1 << 20


def _file_problem(what: str, path: Path, got: str | None = None, allowed: str | None = None) -> SpecError:
    return SpecError([Problem(("(file)",), what, got=got or repr(str(path)), allowed=allowed)], str(path))


def read_spec_text(path: Path) -> str:
    """The spec file's text; SpecError (one line, naming the file) for anything but a readable UTF-8 file."""
    try:
        info = path.stat()
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise SpecError([Problem(("(file)",), "no such spec file", got=repr(str(path)))]) from exc
    except OSError as exc:
        raise _file_problem(f"cannot read the spec file: {exc.strerror or exc}", path) from exc
    except ValueError as exc:  # a NUL byte in the name
        raise _file_problem("not a valid file name", path) from exc
    if stat.S_ISDIR(info.st_mode):
        raise _file_problem("is a directory, not a spec file", path, allowed="a YAML file")
    if not stat.S_ISREG(info.st_mode):  # a FIFO or device would block or never end
        raise _file_problem("not a regular file", path, allowed="a YAML file")
    if info.st_size > MAX_SPEC_BYTES:
        raise _file_problem("too large for a spec file", path, got=f"{info.st_size} bytes",
                            allowed=f"at most {MAX_SPEC_BYTES} bytes")
    try:
        data = path.read_bytes()
    except OSError as exc:  # permission denied, I/O error, vanished since stat
        raise _file_problem(f"cannot read the spec file: {exc.strerror or exc}", path) from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise _file_problem(f"not UTF-8 text: byte 0x{data[exc.start]:02x} at line {line}, column {column}", path,
                            allowed="a UTF-8 YAML file") from exc


def parse_spec(raw: Any, source: str | None = None) -> PipelineSpec:
    """Validate a raw spec mapping; SpecError with every problem, one line each."""
    if not isinstance(raw, dict):
        raise SpecError([Problem(("(top level)",), "expected a mapping of spec keys", got=type(raw).__name__,
                                 allowed=", ".join(PipelineSpec.model_fields))], source)
    try:
        return PipelineSpec.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(from_validation_error(exc, PipelineSpec), source) from exc


def load_spec(path: str | Path, check_data: bool = True, overrides: dict[str, Any] | None = None) -> PipelineSpec:
    """Read, validate and resolve a spec file; with `check_data`, also check it against its data.

    Relative data paths resolve against the spec file's directory. `overrides` (dotted
    path -> value, from `--set`) are applied before validation, so they are checked too.
    """
    path = Path(path)
    raw = load_yaml(read_spec_text(path), str(path))
    if overrides and isinstance(raw, dict):  # a non-mapping file fails in parse_spec below
        try:
            set_paths(raw, overrides)
        except SpecProblem as exc:
            raise SpecError(list(exc.problems), str(path)) from exc
    spec = parse_spec(raw, source=str(path))
    src = spec.data.source
    if src.path and "://" not in src.path and not Path(src.path).is_absolute():
        resolved = str((path.parent / src.path).resolve())
        spec = spec.model_copy(update={"data": spec.data.model_copy(update={"source": src.model_copy(update={"path": resolved})})})
    keys_file = spec.serve.auth.api_keys_file if spec.serve and spec.serve.auth else None
    if keys_file and not Path(keys_file).expanduser().is_absolute():  # replicas run elsewhere: pass an absolute path
        auth = spec.serve.auth.model_copy(update={"api_keys_file": str((path.parent / keys_file).resolve())})
        spec = spec.model_copy(update={"serve": spec.serve.model_copy(update={"auth": auth})})
    if check_data:
        from rayline.data.schema_check import check_spec_against_data

        problems = check_spec_against_data(spec)
        if problems:
            raise SpecError(problems, str(path))
    return spec
