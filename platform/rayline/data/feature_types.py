"""`data.feature_types`: a feature's type, stated or inferred, and the step it implies.

Types: numeric, categorical, text, image. A column's type is inferred where that is unambiguous:
number and boolean columns are numeric, binary columns (encoded image files) are images, and a
column a step names has that step's type (one_hot: categorical, text, image). A string column no
step names is ambiguous (categories or free text?) and must be stated, here or by naming it in a
step. A stated type with no step naming its column gets its default step, appended to
data.preprocess:

- categorical: `one_hot` (handle_unknown: ignore), integer columns too (codes, zip codes);
- text: `text` with its defaults (a word tokenizer of 5,000 tokens, 64 tokens per text);
- image: `image` at the first image's size (scaled down to at most 224 pixels a side, keeping
  its shape) and channels (1 for grayscale files, else 3), as Ludwig infers it;
- numeric: none (the column reaches the model as it is).

A stated type that contradicts the column (text for a number column) or a step (categorical
for a column a text step names) is a problem naming both.
"""

from __future__ import annotations

from typing import Callable

from rayline.data.step_base import NUMERIC_KINDS, ColumnPlan

__all__ = ["FEATURE_TYPES", "MAX_INFERRED_SIDE", "COLUMN_KINDS_OF", "image_columns", "inferred_image_params",
           "with_default_steps", "with_step_columns"]

FEATURE_TYPES = ("numeric", "categorical", "text", "image")
MAX_INFERRED_SIDE = 224  # an inferred image size's longest side, at most

# The column kinds (data/preprocess.column_kind) each type can be read from.
COLUMN_KINDS_OF = {
    "numeric": NUMERIC_KINDS,
    "categorical": ("string", "integer", "boolean"),
    "text": ("string",),
    "image": ("binary", "string"),
}
_STEP_TYPES = {"one_hot": "categorical", "text": "text", "image": "image"}
_GRAYSCALE_MODES = ("1", "L", "LA", "I", "I;16", "F")  # palette (P) images are taken as colour


def with_step_columns(data_spec, features: list[str], kinds: dict[str, str]) -> tuple[object, list[str]]:
    """(the data spec with every `image` and `text` step that names no `columns` given the data's only
    column of its kind, problems). An image column is a binary one (encoded files: an image folder's
    `image`) or one stated image in data.feature_types; a text column is one stated text, or else a
    string column no step and no stated type claims. None or several is a problem naming them."""
    steps = list(data_spec.preprocess)
    dumped = [next(iter(step.model_dump(by_alias=True).items())) for step in steps]
    if not any(kind in ("image", "text") and (params or {}).get("columns") is None for kind, params in dumped):
        return data_spec, []
    stated = data_spec.feature_types
    named = {c for _, params in dumped if isinstance(params, dict) and isinstance(params.get("columns"), list)
             for c in params["columns"]}
    candidates = {
        "image": [c for c in features if stated.get(c) == "image" or (kinds.get(c) == "binary" and c not in stated)],
        "text": [c for c in features if stated.get(c) == "text"] or
                [c for c in features if kinds.get(c) == "string" and c not in stated and c not in named],
    }
    problems, filled = [], []
    for index, (step, (kind, params)) in enumerate(zip(steps, dumped)):
        found = candidates.get(kind)
        if found is None or params.get("columns") is not None:
            filled.append(step)
        elif len(found) == 1:
            filled.append(type(step).model_validate({kind: {**params, "columns": found}}))
        else:
            at = f"data.preprocess[{index}].{kind}.columns"
            problems.append(
                f"{at}: the data has {len(found)} {kind} columns; name the ones this step encodes (got none; "
                f"allowed: {', '.join(found)})" if found else
                f"{at}: the data has no {kind} column to default to (got none; allowed: a list of columns: "
                + ("binary image files, or string columns data.feature_types states image)" if kind == "image" else
                   "string columns, or ones data.feature_types states text)"))
            filled.append(step)
    if problems:
        return data_spec, problems
    return data_spec.model_copy(update={"preprocess": filled}), []


def image_columns(data_spec, columns: list[str]) -> list[str]:
    """The columns the spec makes images: stated so, or named by an image step."""
    named = {c for step in data_spec.preprocess for kind, params in step.model_dump().items()
             if kind == "image" for c in params["columns"] or ()}
    stated = {c for c, t in data_spec.feature_types.items() if t == "image"}
    return [c for c in columns if c in named | stated]


def inferred_image_params(value, column: str) -> dict:
    """The image step's size and channels for a column whose first image is `value` (bytes)."""
    import io

    from PIL import Image, UnidentifiedImageError

    from rayline.data.images import image_bytes

    try:
        with Image.open(io.BytesIO(image_bytes(value))) as image:
            width, height = image.size
            mode = image.mode
    except (ValueError, UnidentifiedImageError, OSError) as exc:
        from rayline.errors import DataError

        why = "not an image Pillow can decode" if isinstance(exc, UnidentifiedImageError) else str(exc)
        raise DataError(f"data.feature_types.{column}: the first image is not usable ({why}), so its size cannot be "
                        "inferred (allowed: a column of images, or an image step with a size)") from None
    scale = min(1.0, MAX_INFERRED_SIDE / max(width, height))
    size = [max(1, round(height * scale)), max(1, round(width * scale))]
    channels = 1 if mode in _GRAYSCALE_MODES else 3
    return {"size": size, "channels": channels}


def with_default_steps(data_spec, features: list[str], kinds: dict[str, str],
                       first_image: Callable[[str], object]) -> tuple[list, list[str]]:
    """(data.preprocess with each typed column's default step appended, problems one line each).

    `kinds`: each feature's column kind; `first_image(col)`: the column's first image value (for
    an inferred size), called only for image columns no image step names."""
    from rayline.data.steps import STEP_SPEC_MODELS

    steps = list(data_spec.preprocess)
    plan = ColumnPlan.of(features, kinds, steps)
    stated = data_spec.feature_types
    problems = []
    allowed = ", ".join(map(str, features[:20])) + (", ..." if len(features) > 20 else "")
    for col, type_ in stated.items():
        at = f"data.feature_types.{col}"
        if col not in features:
            problems.append(f"{at}: not a feature (got {col!r}; allowed: {allowed})")
            continue
        kind = kinds.get(col)
        if kind is not None and kind not in COLUMN_KINDS_OF[type_]:
            problems.append(f"{at}: a {kind} column cannot be {type_} (got {type_!r}; allowed: "
                            f"{', '.join(t for t, ks in COLUMN_KINDS_OF.items() if kind in ks)})")
            continue
        by = _step_type(plan, col)
        if by is not None and by[0] != type_:
            problems.append(f"{at}: stated {type_} but data.preprocess[{by[1]}] is a {by[2]} step, which makes it "
                            f"{by[0]} (got {type_!r}; allowed: {by[0]!r}, or another step for the column)")
    if problems:
        return steps, problems

    wanted = {t: [] for t in FEATURE_TYPES}
    for col in features:
        if _step_type(plan, col) is not None:
            continue
        type_ = stated.get(col) or ("image" if kinds.get(col) == "binary" else None)
        if type_ is not None:
            wanted[type_].append(col)
    if wanted["categorical"]:
        steps.append(STEP_SPEC_MODELS["one_hot"].model_validate({"one_hot": {"columns": wanted["categorical"]}}))
    if wanted["text"]:
        steps.append(STEP_SPEC_MODELS["text"].model_validate({"text": {"columns": wanted["text"]}}))
    by_shape: dict[tuple, list[str]] = {}
    for col in wanted["image"]:
        params = inferred_image_params(first_image(col), col)
        by_shape.setdefault((*params["size"], params["channels"]), []).append(col)
    for (height, width, channels), cols in by_shape.items():
        steps.append(STEP_SPEC_MODELS["image"].model_validate(
            {"image": {"columns": cols, "size": [height, width], "channels": channels}}))
    return steps, problems


def _step_type(plan: ColumnPlan, col: str) -> tuple[str, int, str] | None:
    """(type, step index, step kind) of the step that encodes `col`, or None."""
    if col in plan.categorical:
        return "categorical", plan.categorical[col], "one_hot"
    if col in plan.decoded:
        kind, index = plan.decoded[col]
        return _STEP_TYPES[kind], index, kind
    return None
