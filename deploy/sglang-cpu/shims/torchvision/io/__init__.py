"""Import-only: text serving never decodes an image."""

import enum

from torchvision._missing import missing


class ImageReadMode(enum.Enum):
    UNCHANGED = 0
    GRAY = 1
    GRAY_ALPHA = 2
    RGB = 3
    RGB_ALPHA = 4


def __getattr__(name):
    return missing(__name__, name)
