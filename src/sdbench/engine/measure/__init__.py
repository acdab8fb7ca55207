"""The measurement core: what runs in the timed engine process and shapes a number.

``engine`` starts an engine (vLLM, or the rehearsal's stand-in by name), ``trials`` times its calls,
``sampling`` the sampling parameters, ``counters`` vLLM's SD counters, ``steptiming`` and ``forcing``
(vLLM plugins: step times, forced acceptance), ``energy`` the meters over the timed window (NVML,
RAPL, or why none), ``summary``/``latencysummary``/``paired`` a cell's record and intervals
(``resampling``), ``progress`` the job's progress lines. It calls vLLM through
:mod:`sdbench.engine.release` and reads the machine through :mod:`sdbench.engine.site`; server mode
(:mod:`sdbench.engine.serving`) and the job drivers (:mod:`sdbench.engine`) depend on it, never it on
them. The rehearsal's stand-in engine it loads by name (:func:`sdbench.rehearsal.module`), so that
code stays outside a measured run's scope.
"""
