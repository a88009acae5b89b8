"""What the torch bench program starts with: the same synthetic data and the same small
ResNet as ``model.py``, in PyTorch (channels first).

The bench runner puts the settings before it: IMAGE, WIDTH, BLOCKS, BATCH, STEPS and
EPOCHS (see ``BenchSettings.program``); ``torch.py`` follows it."""

# the settings are defined by the lines the runner puts first
# ruff: noqa: F821
import time

import numpy as np
import torch

x = np.random.default_rng(0).random((BATCH * 4, IMAGE, IMAGE, 3), dtype=np.float32)
y = np.random.default_rng(1).integers(0, 10, BATCH * 4)
x = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous()
y = torch.from_numpy(y)


class Residual(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Conv2d(WIDTH, WIDTH, 3, padding=1)
        self.second = torch.nn.Conv2d(WIDTH, WIDTH, 3, padding=1)

    def forward(self, h):
        return torch.relu(h + self.second(torch.relu(self.first(h))))


def make_model():
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, WIDTH, 3, padding=1),
        torch.nn.ReLU(),
        *[Residual() for _ in range(BLOCKS)],
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(WIDTH, 10),
    )


def report_rate(images_per_step, started):
    rate = images_per_step * STEPS * (EPOCHS - 1) / (time.perf_counter() - started)
    print(f"BENCH images_per_sec={rate:.1f}", flush=True)
