"""Loading a spec file: every unreadable file and every abuse of YAML is a one-line SpecError, never a traceback or a hang."""

import os
import time
from pathlib import Path

import pytest

from rayline.errors import SpecError
from rayline.spec import MAX_SPEC_BYTES, Problem, load_spec, parse_set_options
from rayline.spec.yaml_safe import MAX_DEPTH, MAX_VALUES
from tests.cli import rayline as rayline_in_process

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "pipelines" / "digits-torch.yaml"


def _problems(path, **kw):
    with pytest.raises(SpecError) as info:
        load_spec(path, check_data=False, **kw)
    for p in info.value.problems:
        assert "\n" not in p, p
    return info.value


def _write(tmp_path, name, content):
    path = tmp_path / name
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    return path


# ---------------------------------------------------------------- the file itself


def test_binary_file(tmp_path):
    path = _write(tmp_path, "spec.yaml", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    err = _problems(path)
    assert err.problems == [f"(file): not UTF-8 text: byte 0x89 at line 1, column 1 (got {str(path)!r}; allowed: a UTF-8 YAML file)"]
    assert err.source == str(path) and isinstance(err.__cause__, UnicodeDecodeError)


def test_latin1_file_names_line_and_column(tmp_path):
    path = _write(tmp_path, "spec.yaml", "name: digits\ndata:\n  label: caf\u00e9\n".encode("latin-1"))
    assert _problems(path).problems == [
        f"(file): not UTF-8 text: byte 0xe9 at line 3, column 13 (got {str(path)!r}; allowed: a UTF-8 YAML file)"]


def test_nul_character_in_utf8_text(tmp_path):
    path = _write(tmp_path, "spec.yaml", "name: a\x00b\n")
    assert _problems(path).problems == [
        "(yaml): line 1, column 8: unacceptable character #x0000: special characters are not allowed"]


def test_directory(tmp_path):
    assert _problems(tmp_path).problems == [
        f"(file): is a directory, not a spec file (got {str(tmp_path)!r}; allowed: a YAML file)"]


def test_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    assert _problems(path).problems == [f"(file): no such spec file (got {str(path)!r})"]
    assert _problems(tmp_path / "nope" / "spec.yaml").problems[0].startswith("(file): no such spec file")


def test_invalid_file_name():
    assert _problems(Path("a\x00b.yaml")).problems == ["(file): not a valid file name (got 'a\\x00b.yaml')"]


def test_fifo_is_rejected_without_blocking(tmp_path):
    path = tmp_path / "spec.yaml"
    os.mkfifo(path)  # nobody writes: reading it would block forever
    assert _problems(path).problems == [f"(file): not a regular file (got {str(path)!r}; allowed: a YAML file)"]


def test_too_large_file(tmp_path):
    path = _write(tmp_path, "spec.yaml", "#" * (MAX_SPEC_BYTES + 1))
    assert _problems(path).problems == [
        f"(file): too large for a spec file (got {MAX_SPEC_BYTES + 1} bytes; allowed: at most {MAX_SPEC_BYTES} bytes)"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a chmod 000 file; test_read_error covers the same branch")
def test_unreadable_file(tmp_path):
    path = _write(tmp_path, "spec.yaml", DIGITS.read_text())
    path.chmod(0)
    assert _problems(path).problems == [f"(file): cannot read the spec file: Permission denied (got {str(path)!r})"]


def test_read_error():
    # A regular file whose read fails, even for root: reading address 0 of this process.
    err = _problems(Path("/proc/self/mem"))
    assert err.problems == ["(file): cannot read the spec file: Input/output error (got '/proc/self/mem')"]
    assert isinstance(err.__cause__, OSError)


def test_empty_file(tmp_path):
    assert _problems(_write(tmp_path, "spec.yaml", "")).problems[0].startswith(
        "(top level): expected a mapping of spec keys (got NoneType;")


# ---------------------------------------------------------------- duplicate keys


def test_duplicate_top_level_key_names_both_lines(tmp_path):
    text = DIGITS.read_text() + "train:\n  epochs: 1\n"
    line = len(DIGITS.read_text().splitlines()) + 1
    first = DIGITS.read_text().splitlines().index("train:") + 1
    assert _problems(_write(tmp_path, "spec.yaml", text)).problems == [
        f"train: duplicate key (got 'train' at lines {first} and {line}; allowed: each key once)"]


@pytest.mark.parametrize("text, expected", [
    ("a:\n  b:\n    c: 1\n    c: 2\n", "a.b.c: duplicate key (got 'c' at lines 3 and 4; allowed: each key once)"),
    ("a:\n  - x: 1\n    y: 2\n    x: 3\n", "a[0].x: duplicate key (got 'x' at lines 2 and 4; allowed: each key once)"),
    ("a: {k: 1, k: 2}\n", "a.k: duplicate key (got 'k' at lines 1 and 1; allowed: each key once)"),
])
def test_duplicate_keys_at_any_depth(tmp_path, text, expected):
    assert _problems(_write(tmp_path, "spec.yaml", text)).problems == [expected]


def test_every_duplicate_is_reported(tmp_path):
    text = "name: a\nname: b\ntrain:\n  epochs: 1\n  epochs: 2\n"
    assert [p.split(":")[0] for p in _problems(_write(tmp_path, "spec.yaml", text)).problems] == ["name", "train.epochs"]


def test_merge_keys_may_be_overridden():
    # `<<: *base` then an explicit key is YAML's merge, not a duplicate.
    from rayline.spec.yaml_safe import load_yaml

    merged = "defaults: &d {epochs: 3, workers: 1}\nt:\n  <<: *d\n  epochs: 5\n"
    assert load_yaml(merged)["t"] == {"epochs": 5, "workers": 1}


# ---------------------------------------------------------------- aliases


def test_recursive_alias_is_rejected(tmp_path):
    err = _problems(_write(tmp_path, "spec.yaml", "name: x\nmodel: &m\n  params: {inner: *m}\n"))
    assert err.problems == ["model.params.inner: recursive YAML alias: the value contains itself "
                            "(got the anchor at line 2; allowed: aliases of complete values)"]
    assert _problems(_write(tmp_path, "l.yaml", "a: &a [1, *a]\n")).problems[0].startswith("a[1]: recursive YAML alias")


def _laughs(levels: int, width: int = 10) -> str:
    lines = ["l0: &l0 [" + ", ".join(["lol"] * width) + "]"]
    for i in range(1, levels + 1):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]")
    return "\n".join(lines) + f"\nname: *l{levels}\nmodel: {{framework: torch, import: 'a:b', params: {{x: *l{levels}}}}}\n"


def test_billion_laughs_fails_fast(tmp_path):
    # 10^9 values from ~400 bytes; before this check an error message json-dumped it (hang).
    path = _write(tmp_path, "spec.yaml", _laughs(9))
    start = time.perf_counter()
    err = _problems(path)
    assert time.perf_counter() - start < 2
    assert err.problems == [f"l4: aliases expand this value to more than {MAX_VALUES:,} values "
                            f"(got the value at line 5; allowed: at most {MAX_VALUES:,})"]


def test_aliases_used_as_intended_still_load(tmp_path):
    text = DIGITS.read_text().replace("  label: target", "  label: &label target", 1) + "x-note: *label\n"
    assert "&label" in text
    err = _problems(_write(tmp_path, "spec.yaml", text))
    assert err.problems[0].startswith("x-note: unknown key")  # loaded fine; only the extra key is wrong
    from rayline.spec.yaml_safe import load_yaml

    assert load_yaml(_laughs(3)) is not None  # 10^3 values: far under the limit


def test_nesting_depth(tmp_path):
    deep = "a: " + "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5) + "\n"
    assert f"nested more than {MAX_DEPTH} levels deep" in _problems(_write(tmp_path, "d.yaml", deep)).problems[0]
    very = "a: " + "[" * 5000 + "]" * 5000 + "\n"  # PyYAML's recursive composer would overflow the stack
    assert _problems(_write(tmp_path, "v.yaml", very)).problems == [
        f"(yaml): nested too deeply to read (allowed: at most {MAX_DEPTH} levels)"]


@pytest.mark.parametrize("text, expected", [
    ("name: x\nwhen: 2026-02-30\n", "(yaml): a value cannot be read: day is out of range for month"),
    ("name: " + "9" * 5000 + "\n", "(yaml): a value cannot be read: Exceeds the limit (4300 digits)"),
    ("name: !!python/object:os.system x\n", "(yaml): line 1, column 7: could not determine a constructor"),
    ("---\nname: a\n---\nname: b\n", "(yaml): line 3, column 1: expected a single document in the stream, but found another document"),
    ("name: x\ndata: [\n", "(yaml): line 3, column 1: expected the node content, but found '<stream end>'"),
])
def test_yaml_errors_are_one_line(tmp_path, text, expected):
    problems = _problems(_write(tmp_path, "spec.yaml", text)).problems
    assert len(problems) == 1 and problems[0].startswith(expected), problems


def test_set_values_go_through_the_same_yaml_checks():
    with pytest.raises(SpecError) as info:
        parse_set_options(["model.params.x=&a [*a]"])
    assert info.value.problems == ["--set model.params.x: the value is not valid YAML: recursive YAML alias: "
                                   "the value contains itself (got '&a [*a]')"]
    assert isinstance(info.value.__cause__, SpecError)


def test_problems_keep_their_parts(tmp_path):
    err = _problems(_write(tmp_path, "spec.yaml", "a: 1\na: 2\n"))
    assert err.details == [Problem(("a",), "duplicate key", got="'a' at lines 1 and 2", allowed="each key once")]


# ---------------------------------------------------------------- through the CLI


def test_cli_bad_files_exit_2_with_one_line_each(tmp_path):
    files = {
        "binary.yaml": (b"\x89PNG\r\n\x1a\n\x00", "(file): not UTF-8 text: byte 0x89 at line 1, column 1"),
        "latin1.yaml": ("name: caf\u00e9\n".encode("latin-1"), "(file): not UTF-8 text: byte 0xe9 at line 1, column 10"),
        "dup.yaml": (DIGITS.read_text() + "train: {epochs: 1}\n", "train: duplicate key (got 'train' at lines"),
        "recursive.yaml": ("a: &a [1, *a]\n", "a[1]: recursive YAML alias"),
        "laughs.yaml": (_laughs(9), "l4: aliases expand this value to more than"),
    }
    paths = [_write(tmp_path, name, content) for name, (content, _) in files.items()]
    folder = tmp_path / "folder.yaml"
    folder.mkdir()
    proc = rayline_in_process("validate", *paths, folder, "/proc/self/mem", cwd=ROOT, extra_env={"COLUMNS": "400"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.splitlines()
    for path, (_, expected) in zip(paths, files.values()):
        at = next(i for i, line in enumerate(lines) if str(path) in line)
        assert lines[at + 1].strip().startswith(expected), (expected, lines[at:at + 3])
    assert "(file): is a directory, not a spec file" in proc.stderr
    assert "(file): cannot read the spec file: Input/output error" in proc.stderr
