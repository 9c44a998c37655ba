"""The torch kinds for images and text (`cnn`, `text_cnn`, `transformer`): one encoder per image or
text feature (a small ResNet-style network per image; a text CNN or a small transformer encoder
trained from scratch per text), their outputs concatenated with the tabular features and fed to
an MLP head (one combiner), so a table with a photo and a description trains as one model. Input
rows are the preprocessing's flat float32 rows; where each image's pixels and each text's token
ids lie comes from the input schema (`FittedPreprocessing.input_schema`). The kind names the text
encoder (`cnn` takes text_cnn's for any text beside its images).

Training-only augmentation (the image step's `augment`) lives in the model and runs only in
training mode: validation, the test split, the probe and every request see the image as it is.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["Augment", "ResidualBlock", "ImageEncoder", "TextCNN", "TextTransformer", "CombinedModel", "build_combined",
           "IMAGE_PARAMS", "TEXT_CNN_PARAMS", "TRANSFORMER_PARAMS", "HEAD_PARAMS"]

IMAGE_PARAMS = ("widths", "blocks")
TEXT_CNN_PARAMS = ("embedding_dim", "filters", "kernel_sizes")
TRANSFORMER_PARAMS = ("width", "heads", "layers")
HEAD_PARAMS = ("hidden_sizes", "dropout")


class Augment(nn.Module):
    """Random left-right flips and pad-and-crop shifts of a (n, C, H, W) batch, in training mode only."""

    def __init__(self, flip: bool = False, crop: int = 0):
        super().__init__()
        self.flip, self.crop = bool(flip), int(crop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        if self.flip:
            mirrored = torch.rand(x.shape[0], device=x.device) < 0.5
            x = torch.where(mirrored[:, None, None, None], x.flip(-1), x)
        if self.crop:
            n, c, h, w = x.shape
            pad = self.crop
            padded = nn.functional.pad(x, (pad, pad, pad, pad))
            dy = torch.randint(0, 2 * pad + 1, (n,), device=x.device)
            dx = torch.randint(0, 2 * pad + 1, (n,), device=x.device)
            rows = (dy[:, None] + torch.arange(h, device=x.device))[:, None, :, None]
            cols = (dx[:, None] + torch.arange(w, device=x.device))[:, None, None, :]
            x = padded[torch.arange(n, device=x.device)[:, None, None, None], torch.arange(c, device=x.device)[None, :, None, None],
                       rows, cols]
        return x


class ResidualBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = (nn.Identity() if stride == 1 and c_in == c_out else
                         nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out)))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ImageEncoder(nn.Module):
    """(n, H*W*C) flat pixels, channels last -> (n, widths[-1]) features."""

    def __init__(self, shape, widths=(32, 64), blocks: int = 1, augment: dict | None = None):
        super().__init__()
        self.height, self.width, self.channels = (int(v) for v in shape)
        widths = [int(w) for w in widths]
        self.augment = Augment(**(augment or {}))
        layers: list = [nn.Conv2d(self.channels, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()]
        c_in = widths[0]
        for stage, c_out in enumerate(widths):
            for block in range(int(blocks)):
                layers.append(ResidualBlock(c_in, c_out, 2 if stage > 0 and block == 0 else 1))
                c_in = c_out
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.body = nn.Sequential(*layers)
        self.out_features = c_in

    def forward(self, flat: torch.Tensor) -> torch.Tensor:
        x = flat.reshape(-1, self.height, self.width, self.channels).permute(0, 3, 1, 2).contiguous()
        return self.body(self.augment(x))


class TextCNN(nn.Module):
    """(n, length) token ids -> (n, filters x len(kernel_sizes)): embedding, 1-D convolutions of each
    kernel size, max over the positions."""

    def __init__(self, vocab_size: int, length: int, embedding_dim: int = 64, filters: int = 64,
                 kernel_sizes=(3, 4, 5)):
        super().__init__()
        self.embedding = nn.Embedding(int(vocab_size), int(embedding_dim), padding_idx=0)
        sizes = [min(int(k), int(length)) for k in kernel_sizes]
        self.convs = nn.ModuleList(nn.Conv1d(int(embedding_dim), int(filters), k) for k in sizes)
        self.out_features = int(filters) * len(sizes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embedding(ids.long()).transpose(1, 2)  # (n, dim, length)
        return torch.cat([torch.relu(conv(x)).amax(dim=2) for conv in self.convs], dim=1)


class TextTransformer(nn.Module):
    """(n, length) token ids -> (n, width): token and position embeddings, a transformer encoder
    trained from scratch, the mean over the non-padding positions."""

    def __init__(self, vocab_size: int, length: int, width: int = 64, heads: int = 4, layers: int = 2):
        super().__init__()
        self.embedding = nn.Embedding(int(vocab_size), int(width), padding_idx=0)
        self.position = nn.Parameter(torch.zeros(1, int(length), int(width)))
        layer = nn.TransformerEncoderLayer(int(width), int(heads), dim_feedforward=2 * int(width), dropout=0.0,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, int(layers), enable_nested_tensor=False)
        self.out_features = int(width)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        ids = ids.long()
        pad = ids == 0
        pad = pad & ~pad.all(dim=1, keepdim=True)  # an empty text attends to its padding rather than nothing
        x = self.encoder(self.embedding(ids) + self.position, src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(2).to(x.dtype)
        return (x * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1.0)


class CombinedModel(nn.Module):
    """Every image and text feature through its encoder, the tabular features as they are, one MLP head."""

    def __init__(self, input_schema: dict, num_outputs: int, text_encoder: str = "text_cnn", widths=(32, 64),
                 blocks: int = 1, embedding_dim: int = 64, filters: int = 64, kernel_sizes=(3, 4, 5), width: int = 64,
                 heads: int = 4, layers: int = 2, hidden_sizes=(128,), dropout: float = 0.0):
        super().__init__()
        segments = [{**s, "type": "image"} for s in input_schema.get("images", [])]
        segments += [{**s, "type": "text"} for s in input_schema.get("texts", [])]
        self.slices = [(int(s["start"]), int(s["stop"])) for s in segments]
        encoders = []
        for s in segments:
            if s["type"] == "image":
                encoders.append(ImageEncoder(s["shape"], widths, blocks, s.get("augment")))
            elif text_encoder == "transformer":
                encoders.append(TextTransformer(s["vocab_size"], s["length"], width, heads, layers))
            else:
                encoders.append(TextCNN(s["vocab_size"], s["length"], embedding_dim, filters, kernel_sizes))
        self.encoders = nn.ModuleList(encoders)
        self.register_buffer("tabular", torch.tensor(input_schema["tabular"], dtype=torch.long), persistent=False)
        size = sum(e.out_features for e in self.encoders) + len(input_schema["tabular"])
        layers_: list = []
        for hidden in hidden_sizes:
            layers_ += [nn.Linear(size, int(hidden)), nn.ReLU()]
            if dropout:
                layers_.append(nn.Dropout(float(dropout)))
            size = int(hidden)
        layers_.append(nn.Linear(size, num_outputs))
        self.head = nn.Sequential(*layers_)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = [encoder(x[:, start:stop]) for encoder, (start, stop) in zip(self.encoders, self.slices)]
        if len(self.tabular):
            parts.append(x.index_select(1, self.tabular))
        return self.head(torch.cat(parts, dim=1))


_NEEDS = {"cnn": ("images", "an image feature", "`- image: {columns: [...], size: [H, W]}`"),
          "text_cnn": ("texts", "a text feature", "`- text: {columns: [...]}`"),
          "transformer": ("texts", "a text feature", "`- text: {columns: [...]}`")}


def build_combined(kind: str, num_features: int, num_outputs: int, input_schema: dict | None = None, **params):
    """The model of kind cnn, text_cnn or transformer for `input_schema`; a SpecError when the data
    has no feature of the type the kind encodes."""
    wanted, what, step = _NEEDS[kind]
    if not (input_schema or {}).get(wanted):
        from rayline.errors import SpecError

        raise SpecError([f"model.kind: {kind} needs {what} (got none; allowed: add {step} to data.preprocess, "
                         "or model.kind: mlp)"])
    return CombinedModel(input_schema, num_outputs, text_encoder="transformer" if kind == "transformer" else "text_cnn",
                         **params)
