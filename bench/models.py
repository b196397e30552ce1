"""Exports the benchmark-only models into DIR:

    conv.pt2   a small conv net, FP32 'image' [-1, 3, 32, 32] -> 'logits' [-1, 10]
               (dynamic batch), about 0.3 M parameters
    resnet18.pt2  ResNet-18 (the 2015 architecture, written here in plain
               PyTorch), FP32 'image' [-1, 3, 224, 224] -> 'logits' [-1, 1000]
               (dynamic batch), 11.7 M parameters, random weights; only with
               --resnet (its build takes minutes)
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


class BasicBlock(torch.nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(cout)
        self.conv2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(cout)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False),
                                                torch.nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.shortcut is None else self.shortcut(x)))


class ResNet18(torch.nn.Module):
    def __init__(self, classes=1000):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 7, 2, 3, bias=False), torch.nn.BatchNorm2d(64),
                                        torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.blocks = torch.nn.Sequential(*blocks)
        self.head = torch.nn.Linear(512, classes)

    def forward(self, image):
        x = self.blocks(self.stem(image))
        return self.head(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    aotid_export.export(ConvNet().eval(), (torch.randn(2, 3, 32, 32),), os.path.join(out, "conv.pt2"),
                        input_names=["image"], output_names=["logits"], dynamic_batch=True)
    if "--resnet" in sys.argv[2:]:
        torch.manual_seed(0)
        aotid_export.export(ResNet18().eval(), (torch.randn(2, 3, 224, 224),), os.path.join(out, "resnet18.pt2"),
                            input_names=["image"], output_names=["logits"], dynamic_batch=True)


if __name__ == "__main__":
    main()
