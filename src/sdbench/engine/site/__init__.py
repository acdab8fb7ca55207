"""The site room: the machine an engine job runs on, as the job sees it.

``hardware`` (the machine's facts and the job's peak memory), ``quietguard`` (is the device quiet,
and which devices are the job's), ``compilecache`` (torch.compile's cache keyed on what it
compiled), and ``preflight`` (a cell's inputs checked before an engine starts, outside the
measurement scope). The energy meters sit in the measurement core (:mod:`sdbench.engine.measure.energy`):
their joules are read over the timed window and land in the cell's record.
"""
