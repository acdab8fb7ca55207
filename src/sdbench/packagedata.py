"""Data files shipped inside the package, read through :mod:`importlib.resources`.

sdbench ships small data files that the code reads at run time:

========================  =============================================  ===========
kind                      shipped in                                     overridable
========================  =============================================  ===========
``cost_models``           ``sdbench/data/cost_models/<name>.yaml``       yes
``models``                ``sdbench/data/models/<org>--<name>.yaml``     yes
``chat_templates``        ``sdbench/data/chat_templates/<name>.jinja``   no
``schemas``               ``sdbench/schemas/<name>.yaml``                no
========================  =============================================  ===========

Reading them through ``importlib.resources`` (never through the working directory or a path
relative to a source checkout) makes an installed wheel (``pip install --no-deps /opt/sdbench``
in the Apptainer images) behave like the editable checkout.

Override directory: set ``SDBENCH_DATA_DIR`` to a directory with the same layout as
``sdbench/data`` (``cost_models/``, ``models/``; either may be absent). A file there shadows the
shipped file of the same name, and :func:`list_data` lists the union. Schemas are not
overridable: they describe what this version of the code accepts. The repository's
``resources/`` directory is unrelated: it holds downloads (hub snapshots, published traces).
"""

from __future__ import annotations

import os
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from sdbench.errors import ConfigError

DATA_DIR_ENV = "SDBENCH_DATA_DIR"

# kind -> folder inside the sdbench package.
KINDS: dict[str, str] = {
    "cost_models": "data/cost_models",
    "models": "data/models",
    "chat_templates": "data/chat_templates",
    "schemas": "schemas",
}
# Kinds that SDBENCH_DATA_DIR/<kind>/ may add to or shadow.
OVERRIDABLE: frozenset[str] = frozenset({"cost_models", "models"})


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown data kind {kind!r} (known: {', '.join(KINDS)})")


def override_dir() -> Path | None:
    """The directory named by ``SDBENCH_DATA_DIR``, or ``None`` when the variable is unset or empty.

    Raises :class:`sdbench.config.ConfigError` (naming the variable and the path) when it is set
    to something that is not a directory: a typo must not silently fall back to shipped data.
    """
    value = os.environ.get(DATA_DIR_ENV, "")
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_dir():
        raise ConfigError(
            f"{DATA_DIR_ENV}={value}: no such directory "
            "(it should hold cost_models/ and/or models/, like sdbench/data; unset it to use the shipped data)"
        )
    return path


def shipped_dir(kind: str) -> Traversable:
    """The package folder holding the shipped files of ``kind`` (a :class:`Traversable`)."""
    _check_kind(kind)
    return resources.files("sdbench").joinpath(KINDS[kind])


def _override_kind_dir(kind: str) -> Path | None:
    root = override_dir() if kind in OVERRIDABLE else None
    return root / kind if root is not None else None


def _names(folder: Traversable | Path | None) -> set[str]:
    if folder is None or not folder.is_dir():
        return set()
    return {p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")}


def list_data(kind: str, suffix: str = ".yaml") -> list[str]:
    """Sorted file names of ``kind`` ending in ``suffix``: shipped ones plus any in ``SDBENCH_DATA_DIR``."""
    _check_kind(kind)
    names = _names(shipped_dir(kind)) | _names(_override_kind_dir(kind))
    return sorted(n for n in names if n.endswith(suffix))


def data_file(kind: str, name: str) -> Traversable | Path:
    """The file ``name`` of ``kind``: ``$SDBENCH_DATA_DIR/<kind>/<name>`` if it exists, else the shipped one.

    The result supports ``read_text()``, ``name`` and ``str()`` (a :class:`~pathlib.Path` for the
    override and for packages installed as plain files). Raises ``FileNotFoundError`` naming where it
    looked and what is available.
    """
    _check_kind(kind)
    if not name or name != Path(name).name or name.startswith("."):
        raise ValueError(f"{name!r}: a data file name is a plain file name, not a path")
    override = _override_kind_dir(kind)
    if override is not None and (override / name).is_file():
        return override / name
    shipped = shipped_dir(kind).joinpath(name)
    if shipped.is_file():
        return shipped
    where = f"{override} or {shipped_dir(kind)}" if override is not None else str(shipped_dir(kind))
    suffix = Path(name).suffix
    available = ", ".join(list_data(kind, suffix)) or "none"
    raise FileNotFoundError(f"no {kind} file {name!r} in {where} (available: {available})")


def read_text(kind: str, name: str) -> str:
    """UTF-8 text of :func:`data_file` ``(kind, name)``."""
    return data_file(kind, name).read_text(encoding="utf-8")
