"""Dataset stage: the prompt sets and the standard-library corpus they are built from."""
