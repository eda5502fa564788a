"""Import-only stand-in for torchvision (no CPU build for torch 2.13 on PyPI).

SGLang's multimodal processors import these names when the server starts; serving text never
calls them. Only ever put on an SGLang server's PYTHONPATH (deploy/sglang-cpu/install.sh).
"""

__version__ = "0.0.0+rollway.stand-in"
