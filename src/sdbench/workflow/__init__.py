"""The workflow's plan and paths: what the Snakefile derives from the config, as tested Python."""
