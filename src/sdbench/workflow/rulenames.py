"""Rule names the plan and the site's checks share, apart so that a check reads them without
importing the plan."""

from __future__ import annotations

# The rules that reach the network (hub models, tokenizers and drafters; hub dataset repositories;
# the paper's published traces): local rules, run by the workflow process on the submitting host
# (compute nodes of a cluster may have no internet). Every other rule is a job of its own.
NETWORK_RULES = ("download_model", "download_dataset", "fetch_published_traces")
