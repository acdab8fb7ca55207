"""Server mode: an OpenAI-compatible vLLM server per arm (``server``), the load generator
(``loadgen``) and the job that interleaves arms and starts (``servegroup``), on the measurement core.
"""
