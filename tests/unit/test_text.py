"""Text features without Ray: the tokenizer the text step trains on the train split's word counts,
its tokens offline and online, errors naming the row, and the torch text encoders.

The end-to-end path (a mixed table with a text column trained, registered and served over HTTP)
is tests/integration/test_text.py.
"""

import json
from collections import Counter

import numpy as np
import pandas as pd
import pytest

from rayline.data.preprocess import FeatureInfo, FittedPreprocessing, LabelInfo, fit_preprocessing
from rayline.data.profile import ProfileRequest, profile_frame
from rayline.errors import DataError
from rayline.spec.data_spec import DataSpec

import tokenizers  # noqa: E402,F401 - a core dependency: the module must fail, never skip, without it

CORPUS = ["the printer is broken", "The printer jams again", "refund my invoice please", "invoice was charged twice",
          "login fails", "cannot login with my password", "the package is late", "where is the package"] * 5


def _frame():
    return pd.DataFrame({"text": CORPUS, "n": np.arange(len(CORPUS), dtype=float),
                         "y": (["hw"] * 2 + ["bill"] * 2 + ["acct"] * 2 + ["ship"] * 2) * 5})


def _fit(frame, **text):
    spec = DataSpec.model_validate({"source": {"format": "csv", "path": "unused.csv"}, "label": "y",
                                    "preprocess": [{"text": {"columns": ["text"], **text}}]})
    features = [FeatureInfo("text", "string"), FeatureInfo("n", "number")]
    return fit_preprocessing(frame[["text", "n"]], features, LabelInfo("y", "classification", ["acct", "bill", "hw", "ship"]),
                             spec.preprocess)


def test_a_word_vocabulary_is_the_most_frequent_words_of_the_train_split():
    fitted = _fit(_frame(), vocab_size=6, max_length=5)
    (step,) = fitted.steps
    vocab = json.loads(step.tokenizers["text"])["model"]["vocab"]
    counts = Counter(w for t in CORPUS for w in t.lower().split())
    top = [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:4]]
    assert vocab == {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(top)}}
    assert step.vocab_sizes == {"text": 6}
    ids = fitted.transform(pd.DataFrame({"text": ["The printer is the THE best printer ever"], "n": [0.0]}))
    # lowercased, a word out of the vocabulary is [UNK] = 1, cut at max_length
    assert ids[0, :5].tolist() == [vocab.get(w, 1) for w in "the printer is the the".split()]
    assert ids[0, 0] == vocab["the"] and 1 in ids[0, :5]
    short = fitted.transform(pd.DataFrame({"text": ["the"], "n": [7.0]}))
    assert short[0].tolist() == [vocab["the"], 0, 0, 0, 0, 7.0]  # padded with [PAD] = 0, then the numeric feature
    assert fitted.output_columns == [f"text[{i}]" for i in range(5)] + ["n"]
    assert [f.kind for f in fitted.features] == ["text", "number"]


def test_word_counts_merged_over_blocks_equal_one_count_of_everything():
    frame = _frame()
    request = ProfileRequest(label=None, numeric=[], quantiles=[], counted=[], texts=[("text", True)])
    whole = profile_frame(frame, request)
    parts = profile_frame(frame.iloc[:13], request).merge(profile_frame(frame.iloc[13:], request), 0)
    assert parts.words == whole.words
    assert whole.words["text|lower"] == Counter(w for t in CORPUS for w in t.lower().split())


def test_bpe_learns_subwords_that_cover_unseen_words_of_known_pieces():
    fitted = _fit(_frame(), tokenizer="bpe", vocab_size=80, max_length=8)
    (step,) = fitted.steps
    assert 10 < step.vocab_sizes["text"] <= 80
    ids = fitted.transform(pd.DataFrame({"text": ["printers invoices"], "n": [0.0]}))[0, :8]
    assert (ids > 1).sum() >= 2 and 1 not in ids[:2]  # known pieces, not [UNK]


def test_requests_tokenize_exactly_as_training_rows_and_the_state_round_trips():
    frame = _frame()
    fitted = _fit(frame, vocab_size=50, max_length=6)
    offline = fitted.transform(frame)
    rows = [{"text": t, "n": float(n)} for t, n in zip(frame["text"], frame["n"])]
    np.testing.assert_array_equal(fitted.encode_records(rows), offline)
    loaded = FittedPreprocessing.from_dict(json.loads(fitted.to_json()))
    np.testing.assert_array_equal(loaded.transform(frame), offline)
    schema = loaded.input_schema()
    assert schema["texts"] == [{"name": "text", "start": 0, "stop": 6, "type": "text", "length": 6,
                                "vocab_size": loaded.steps[0].vocab_sizes["text"]}]
    assert schema["images"] == [] and schema["tabular"] == [6]


def test_bad_text_values_name_the_row():
    from rayline.data.text import MAX_TEXT_CHARS

    fitted = _fit(_frame())
    with pytest.raises(DataError, match=r"^instances\[1\]\.text: text expected \(got int\)"):
        fitted.encode_records([{"text": "ok", "n": 1.0}, {"text": 5, "n": 1.0}])
    with pytest.raises(DataError, match=r"^instances\[0\]\.text: missing"):
        fitted.encode_records([{"text": None, "n": 1.0}])
    with pytest.raises(DataError, match=rf"^instances\[0\]\.text: text of {MAX_TEXT_CHARS + 1:,} characters"):
        fitted.encode_records([{"text": "a" * (MAX_TEXT_CHARS + 1), "n": 1.0}])


def test_an_impute_step_fills_missing_text_before_tokenizing():
    spec = DataSpec.model_validate({"source": {"format": "csv", "path": "unused.csv"}, "label": "y", "preprocess": [
        {"impute": {"columns": ["text"], "strategy": "constant", "value": "printer"}},
        {"text": {"columns": ["text"], "max_length": 3}}]})
    frame = _frame()
    fitted = fit_preprocessing(frame[["text", "n"]], [FeatureInfo("text", "string"), FeatureInfo("n", "number")],
                               LabelInfo("y", "classification", ["acct", "bill", "hw", "ship"]), spec.preprocess)
    filled = fitted.encode_records([{"text": None, "n": 1.0}])
    assert filled.tolist() == fitted.encode_records([{"text": "printer", "n": 1.0}]).tolist()
    assert fitted.features[0].nullable


@pytest.mark.parametrize("preprocess, message", [
    ([{"text": {"columns": ["n"]}}], "data.preprocess[0].text.columns[0]: needs a text column (got 'n', a number column"),
    ([{"one_hot": {"columns": ["text"]}}, {"text": {"columns": ["text"]}}],
     "data.preprocess[1].text.columns[0]: column 'text' was one-hot encoded by data.preprocess[0]"),
    ([{"text": {"columns": ["text"]}}, {"standard_scale": {"columns": ["text"]}}],
     "data.preprocess[1].standard_scale.columns[0]: column 'text' was encoded by the text step data.preprocess[0]"),
    ([], "data.features: string columns ['text'] need encoding (allowed: add `- one_hot: {columns: ['text']}` to "
         "data.preprocess for categories, `- text: {columns: ['text']}` for free text"),
])
def test_misplaced_text_steps_are_named(preprocess, message):
    from rayline.data.steps import check_steps

    spec = DataSpec.model_validate({"source": {"format": "csv", "path": "unused.csv"}, "label": "y", "preprocess": preprocess})
    problems = check_steps(["text", "n"], {"text": "string", "n": "number"}, spec.preprocess)
    assert any(p.startswith(message) for p in problems), problems


# ---------------------------------------------------------------- the torch text encoders


def _schema():
    return {"num_features": 9, "images": [], "texts": [{"name": "text", "start": 0, "stop": 8, "type": "text",
                                                        "length": 8, "vocab_size": 30}], "tabular": [8]}


@pytest.mark.parametrize("kind, params", [("text_cnn", {"embedding_dim": 8, "filters": 4, "kernel_sizes": [2, 3]}),
                                          ("transformer", {"width": 8, "heads": 2, "layers": 1})])
def test_text_kinds_encode_token_ids_beside_the_tabular_features(kind, params):
    import torch
    from rayline.inference.torch_model import build_model

    torch.manual_seed(0)
    model = build_model({"num_features": 9, "num_outputs": 4, "input_schema": _schema(),
                         "model": {"kind": kind, "params": {**params, "hidden_sizes": [8]}}}).eval()
    ids = torch.tensor([[3, 4, 5, 0, 0, 0, 0, 0, 2.0], [3, 4, 5, 6, 7, 8, 9, 10, -1.0]])
    out = model(ids)
    assert out.shape == (2, 4)
    other = ids.clone()
    other[0, 1] = 11
    assert not torch.allclose(model(other)[0], out[0])  # the tokens matter
    if kind == "transformer":
        empty = torch.zeros(1, 9)
        assert torch.isfinite(model(empty)).all()  # an empty text (all padding) still answers


def test_a_text_kind_without_a_text_feature_is_refused_naming_the_fix():
    from rayline.errors import SpecError
    from rayline.inference.torch_model import build_model

    with pytest.raises(SpecError, match=r"model.kind: transformer needs a text feature .*`- text: \{columns: \[...\]\}`"):
        build_model({"num_features": 2, "num_outputs": 2, "input_schema": {"num_features": 2, "images": [], "texts": [],
                                                                           "tabular": [0, 1]},
                     "model": {"kind": "transformer", "params": {}}})


def test_one_model_takes_an_image_a_text_and_tabular_features_together():
    """A mixed table: an encoder per image and per text, their outputs joined with the tabular
    features in one head; each part changes the answer."""
    import torch
    from rayline.inference.torch_model import build_model

    schema = {"num_features": 26, "images": [{"name": "photo", "start": 0, "stop": 16, "type": "image", "shape": [4, 4, 1],
                                              "augment": {}}],
              "texts": [{"name": "text", "start": 16, "stop": 24, "type": "text", "length": 8, "vocab_size": 30}],
              "tabular": [24, 25]}
    torch.manual_seed(0)
    model = build_model({"num_features": 26, "num_outputs": 3, "input_schema": schema,
                         "model": {"kind": "cnn", "params": {"widths": [4], "embedding_dim": 4, "filters": 4,
                                                             "kernel_sizes": [2], "hidden_sizes": [8]}}}).eval()
    assert [type(e).__name__ for e in model.encoders] == ["ImageEncoder", "TextCNN"]
    x = torch.cat([torch.randn(2, 16), torch.tensor([[3.0, 4, 5, 0, 0, 0, 0, 0]] * 2), torch.randn(2, 2)], dim=1)
    base = model(x)
    for column in (3, 17, 25):  # a pixel, a token, a tabular feature
        changed = x.clone()
        changed[:, column] += 7.0 if column != 17 else 6.0
        assert not torch.allclose(model(changed), base), column
