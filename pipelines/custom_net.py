"""An example custom model for `model.import: "pipelines.custom_net:build"`."""

import torch.nn as nn


def build(num_features: int, num_outputs: int, width: int = 32):
    return nn.Sequential(nn.Linear(num_features, width), nn.Tanh(), nn.Linear(width, num_outputs))
