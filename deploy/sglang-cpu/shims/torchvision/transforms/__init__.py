"""Names SGLang imports from torchvision.transforms at start-up (see the package docstring)."""

import enum

from torchvision._missing import missing
from torchvision.transforms import functional, v2


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


__all__ = ["InterpolationMode", "functional", "v2"]


def __getattr__(name):
    return missing(__name__, name)
