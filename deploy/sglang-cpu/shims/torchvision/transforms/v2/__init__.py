"""Import-only: text serving never calls an image transform."""

from torchvision._missing import missing
from torchvision.transforms.v2 import functional

__all__ = ["functional"]


def __getattr__(name):
    return missing(__name__, name)
