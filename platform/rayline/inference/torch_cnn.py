"""The torch `cnn` model kind: a small ResNet-style encoder per image feature, its pooled output
concatenated with the tabular features and fed to an MLP head (one combiner), so a table with a
photo trains as one model. Input rows are the preprocessing's flat float32 rows; where each
image's pixels lie comes from the input schema (`FittedPreprocessing.input_schema`).

Training-only augmentation (the image step's `augment`) lives in the model and runs only in
training mode: validation, the test split, the probe and every request see the image as it is.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["Augment", "ResidualBlock", "ImageEncoder", "CombinedModel", "build_cnn"]


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
        x = flat.reshape(-1, self.height, self.width, self.channels).permute(0, 3, 1, 2)
        return self.body(self.augment(x))


class CombinedModel(nn.Module):
    """Every image feature through its encoder, the tabular features as they are, one MLP head."""

    def __init__(self, input_schema: dict, num_outputs: int, widths=(32, 64), blocks: int = 1,
                 hidden_sizes=(128,), dropout: float = 0.0):
        super().__init__()
        self.slices = [(int(s["start"]), int(s["stop"])) for s in input_schema["images"]]
        self.encoders = nn.ModuleList(ImageEncoder(s["shape"], widths, blocks, s.get("augment")) for s in input_schema["images"])
        self.register_buffer("tabular", torch.tensor(input_schema["tabular"], dtype=torch.long), persistent=False)
        width = sum(e.out_features for e in self.encoders) + len(input_schema["tabular"])
        layers: list = []
        for size in hidden_sizes:
            layers += [nn.Linear(width, int(size)), nn.ReLU()]
            if dropout:
                layers.append(nn.Dropout(float(dropout)))
            width = int(size)
        layers.append(nn.Linear(width, num_outputs))
        self.head = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = [encoder(x[:, start:stop]) for encoder, (start, stop) in zip(self.encoders, self.slices)]
        if len(self.tabular):
            parts.append(x.index_select(1, self.tabular))
        return self.head(torch.cat(parts, dim=1))


def build_cnn(num_features: int, num_outputs: int, input_schema: dict | None = None, widths=(32, 64), blocks: int = 1,
              hidden_sizes=(128,), dropout: float = 0.0):
    if not input_schema or not input_schema.get("images"):
        from rayline.errors import SpecError

        raise SpecError(["model.kind: cnn needs an image feature (got none; allowed: add `- image: {columns: [...], "
                         "size: [H, W]}` to data.preprocess, or model.kind: mlp)"])
    return CombinedModel(input_schema, num_outputs, widths=widths, blocks=blocks, hidden_sizes=hidden_sizes,
                         dropout=dropout)
