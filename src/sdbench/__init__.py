"""sdbench: a reproducible benchmark pipeline for speculative decoding."""

__version__ = "0.1.0"
