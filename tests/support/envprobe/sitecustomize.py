"""Test probe, not part of sdbench: with ``SDBENCH_ENV_PROBE_DIR`` set, every Python process that
starts with this directory on ``PYTHONPATH`` writes ``<dir>/<pid>.json``: its command line and the
hub and network variables of its environment (tests/site/test_hub.py: what a job's process really got).
"""

import json
import os

_dir = os.environ.get("SDBENCH_ENV_PROBE_DIR")
if _dir:
    try:
        with open("/proc/self/cmdline", "rb") as _fh:
            _argv = [a.decode(errors="replace") for a in _fh.read().split(b"\0") if a]
        _names = ("HF_TOKEN", "HF_ENDPOINT", "http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "no_proxy",
                  "NO_PROXY", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
        _env = {k: v for k, v in os.environ.items() if k in _names or k.startswith(("APPTAINERENV_", "SINGULARITYENV_"))}
        with open(os.path.join(_dir, f"{os.getpid()}.json"), "w") as _fh:
            json.dump({"argv": _argv, "env": _env}, _fh)
    except OSError:
        pass
