"""Simulator stage: trace-replay simulation of speculative-decoding speedup, its policies and cost models."""
