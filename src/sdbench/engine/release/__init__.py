"""The vLLM release room: what each release offers and how the engine reaches it.

``touchpoints`` (every vLLM name the package touches, standard library only), ``versions`` (what each
release does differently, in one place), the vLLM plugins that patch or probe a release
(``enginefixes``, ``workerprobe``, ``acceptancetrace``), the CPU build's kernels (``cpukernels``) and
``conformance`` (the check of the touchpoints against the releases' own sources, run offline: not in
an engine job's closure). The measurement core calls vLLM through this room and nothing else.
"""
