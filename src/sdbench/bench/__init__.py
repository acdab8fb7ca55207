"""Benchmarks of pipeline components (``sdbench bench ...``), not pipeline steps."""
