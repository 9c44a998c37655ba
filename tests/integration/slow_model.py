"""A torch model whose training step sleeps, for tests that need a run to last (a time budget, a job
to stop while it trains) without burning the CPUs the other lane's tests need meanwhile: 5000 epochs
of the plain iris MLP kept both cores busy for all of a 45-s budget.

`write(folder)` puts the builder module beside a spec there; the spec names it as
`model: {framework: torch, import: "slow_net:build", params: {step_s: ...}}` (MODEL)."""

from pathlib import Path

SOURCE = '''
import time


def build(num_features, num_outputs, step_s=0.2):
    import torch.nn as nn

    class SlowStep(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(num_features, num_outputs)

        def forward(self, x):
            if self.training:
                time.sleep(step_s)
            return self.linear(x)

    return SlowStep()
'''

MODEL = {"framework": "torch", "import": "slow_net:build", "params": {"step_s": 0.2}}


def write(folder) -> None:
    (Path(folder) / "slow_net.py").write_text(SOURCE)
