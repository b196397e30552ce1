"""Exports the benchmark-only models into DIR:

    conv.pt2   a small conv net, FP32 'image' [-1, 3, 32, 32] -> 'logits' [-1, 10]
               (dynamic batch), about 0.3 M parameters
"""

import os
import sys

import torch

import aotid_export


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(64, 128, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1))
        self.head = torch.nn.Linear(128, 10)

    def forward(self, image):
        return self.head(torch.flatten(self.features(image), 1))


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    aotid_export.export(ConvNet().eval(), (torch.randn(2, 3, 32, 32),), os.path.join(out, "conv.pt2"),
                        input_names=["image"], output_names=["logits"], dynamic_batch=True)


if __name__ == "__main__":
    main()
