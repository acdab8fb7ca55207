"""Models stage: the small models the pipeline trains, downloaded models, architecture specs and checks."""
