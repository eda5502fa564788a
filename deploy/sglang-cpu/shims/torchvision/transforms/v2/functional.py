"""Import-only: text serving never calls an image transform."""

from torchvision._missing import missing


def __getattr__(name):
    return missing(__name__, name)
