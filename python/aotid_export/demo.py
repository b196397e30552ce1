"""The demo model that `./dev run` serves when the store is empty: a small
classifier over 4 features with fixed weights, so answers are repeatable."""

import torch


class DemoClassifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.hidden = torch.nn.Linear(4, 16)
        self.out = torch.nn.Linear(16, 3)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.out(torch.relu(self.hidden(features))), dim=-1)


def make_model() -> torch.nn.Module:
    return DemoClassifier()
