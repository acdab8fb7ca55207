"""Analyses of measured runs and traces: end-to-end speedups, memory, BLEU, acceptance, breakdown."""
