"""Trace stage: per-position acceptance trace tables, the offline n-gram tracer, published traces."""
