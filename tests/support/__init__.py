"""Helpers of the test suite: tokenizers and hub copies the tests make, the local SLURM cluster, test doubles."""
