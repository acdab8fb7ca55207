"""Engine stage: cells measured on a real vLLM engine, in rooms.

The job drivers sit here (``cli``, ``commands``, ``groups``, ``tracegroup``) with ``scope`` (the
code a measurement depends on); the rooms below them: :mod:`~sdbench.engine.measure` (the timed
core), :mod:`~sdbench.engine.release` (vLLM releases), :mod:`~sdbench.engine.site` (the machine),
:mod:`~sdbench.engine.serving` (server mode). docs/house.md maps them.
"""
