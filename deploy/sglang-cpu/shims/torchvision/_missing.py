"""The stand-in for any torchvision name that text serving imports but never calls."""


def missing(module: str, name: str):
    if name.startswith("__"):
        raise AttributeError(name)

    def unavailable(*args, **kwargs):
        raise RuntimeError(f"torchvision stand-in: {module}.{name} is not available on this SGLang server")

    unavailable.__name__ = name
    return unavailable
