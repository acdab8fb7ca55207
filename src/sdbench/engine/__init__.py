"""Engine stage: cells measured on a real vLLM engine, and the plugins that run inside it."""
