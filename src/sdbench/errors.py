"""Exceptions shared across the package (a leaf module: it imports nothing from sdbench)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration problem; the message names the offending key."""


class RehearsalError(ValueError):
    """Rehearsal cells (``measured`` false) where only measured ones are accepted (``sdbench
    compare``, ``sdbench bundle create``) without ``--allow-rehearsal``; the message names the run."""
