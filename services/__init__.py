"""rollway: RL and SFT post-training for Hugging Face causal LMs, as four gRPC services."""

__version__ = "0.1.0"
