"""A frozen, verifiable artifact bundle of a finished run (``sdbench bundle create|verify|config``).

One ``.tar.gz`` holds, under a single top directory ``sdbench-bundle/``::

    ro-crate-metadata.json        RO-Crate 1.3, Workflow Run Crate 0.5 (+ Process Run Crate 0.5)
    MANIFEST.sha256               sha256sum format, sorted, every file but itself
    Snakefile, workflow/...       the workflow source (main entity of the crate)
    config/<name>                 the resolved config (every default filled in)
    report/<name>                 the Snakemake HTML report
    containers/images.yaml        container image digests (when the file exists)
    environments/<NAME>.txt       package versions (``pip freeze``) of each named environment
    provenance/cells.parquet      engine versions, hardware and ``measured`` of every cell (from summary.parquet)
    provenance/excluded.tsv       what was left out of results/ and why (path, bytes, sha256)
    results/...                   the results tree, minus what is excluded below

Excluded from ``results/`` (weights are listed in ``provenance/excluded.tsv`` with size and sha256,
so a rebuilt model can still be checked against the run):

- model weights (``*.safetensors``, ``*.bin``, ``*.pt`` ...): the built models are re-trained
  deterministically from the resolved config and seed, and weights are most of the bytes; their
  ``config.json``, tokenizer files and training log stay in;
- ``results/engines/``: each engine group's copy of its cells' tables, which are bundled
  under ``results/runs/`` (listed in ``excluded.tsv``);
- ``results/bundle/``: this command's own outputs (the archive, and the report, config and freeze
  that enter the bundle through their own options);
- hidden files (``.snakemake_timestamp`` markers, ``.<name>.tmp`` files of interrupted atomic writes).

A run holding rehearsal cells (``measured`` false in a ``summary.parquet``, :mod:`sdbench.provenance`)
is refused in one line unless ``allow_rehearsal`` (``--allow-rehearsal``): then the crate's name
and description say it is a rehearsal.

Deterministic: members sorted, fixed mtime/uid/gid/owner/mode in the tar, gzip header mtime 0 and
no file name, and the crate has fixed ids and no wall-clock date (``datePublished`` is
``--date-published``, else ``$SOURCE_DATE_EPOCH``, else the run's end time, else left out).
The crate's metadata is built and checked in :mod:`sdbench.crate`.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import io
import json
import logging
import os
import re
import sys
import tarfile
from base64 import urlsafe_b64encode
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, BinaryIO

import yaml

from sdbench.crate import CRATE_METADATA, MANIFEST, CrateInfo, build_crate, crate_problems, image_reference
from sdbench.errors import ConfigError
from sdbench.io import atomic_path, write_text
from sdbench.provenance import MEASURED, refuse_rehearsal, rehearsal_rows
from sdbench.workflow import paths as P

if TYPE_CHECKING:  # pandas is imported where used: the workflow imports this module at parse time
    import pandas as pd

log = logging.getLogger(__name__)

BUNDLE_ROOT = "sdbench-bundle"

# Weights are rebuilt from the config; everything else under results/ is a result.
WEIGHT_SUFFIXES = frozenset({".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".onnx", ".h5", ".msgpack"})
EXCLUDED_RESULT_DIRS = frozenset({P.stage_dir(P.BUNDLE_DIR)})

# Keys of sdbench.engine.site.hardware.provenance(), recorded in every cell's summary.parquet.
PROVENANCE_COLUMNS = (
    "vllm_version",
    "torch_version",
    "transformers_version",
    "sdbench_version",
    "python_version",
    "code_digest",
    "measurement_digest",
    "hostname",
    "cpu_model",
    "cpu_count",
    "gpus",
    "gpu_memory_mib",
    "gpu_driver",
    "hardware",
)
_INT_COLUMNS = ("batch_size", "cpu_count", "gpu_memory_mib")
CELL_KEYS = ("engine", "model", "dataset", "method", "batch_size")
CELL_EXTRA = ("drafter", "speculative_config")

TAR_MTIME = 0
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_ENV_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclasses.dataclass(frozen=True)
class Member:
    """One file of the bundle: its path inside the bundle and its bytes (a file or in memory)."""

    arcname: str
    source: Path | None = None
    data: bytes | None = None

    def open(self) -> BinaryIO:
        """A binary stream of the member's content."""
        return io.BytesIO(self.data) if self.data is not None else open(self.source, "rb")  # type: ignore[arg-type]

    def size(self) -> int:
        """Size in bytes."""
        return len(self.data) if self.data is not None else self.source.stat().st_size  # type: ignore[union-attr]


def sha256_stream(stream: BinaryIO, chunk: int = 1 << 20) -> str:
    """Hex sha256 of everything left in ``stream``."""
    digest = hashlib.sha256()
    while block := stream.read(chunk):
        digest.update(block)
    return digest.hexdigest()


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file."""
    with open(path, "rb") as fh:
        return sha256_stream(fh)


def _check_arcname(arcname: str) -> str:
    # sha256sum escapes names holding a newline or backslash; keep the manifest plain instead.
    if "\n" in arcname or "\\" in arcname or arcname.startswith("/") or ".." in PurePosixPath(arcname).parts:
        raise ConfigError(f"{arcname}: file name not allowed in a bundle (newline, backslash or outside the root)")
    return arcname


def _walk_files(top: Path) -> Iterator[tuple[str, Path]]:
    """(posix path relative to ``top``, path) of every file below ``top``, sorted, hidden ones included."""
    for root, dirs, files in os.walk(top):
        dirs.sort()
        for name in sorted(files):
            path = Path(root) / name
            yield path.relative_to(top).as_posix(), path


def collect_results(results: Path) -> tuple[list[tuple[str, Path]], list[tuple[str, Path, str]]]:
    """Split the files under ``results`` into included ``(rel, path)`` and excluded ``(rel, path, reason)``.

    Bundle outputs and hidden files are skipped without a trace (see the module docstring).
    """
    if not results.is_dir():
        raise ConfigError(f"--results {results}: not a directory")
    included, excluded = [], []
    for rel, path in _walk_files(results):
        parts = PurePosixPath(rel).parts
        # Bundle outputs (among them the archive being written) and hidden files: Snakemake's
        # .snakemake_timestamp markers, .<name>.tmp of interrupted atomic writes.
        if parts[0] in EXCLUDED_RESULT_DIRS or any(p.startswith(".") for p in parts):
            continue
        if path.suffix.lower() in WEIGHT_SUFFIXES:
            excluded.append((rel, path, "model weights (rebuilt from the config)"))
        elif parts[0] == P.stage_dir(P.GROUP_DIR):
            excluded.append((rel, path, "engine-group copy of a cell's tables (bundled under results/runs/)"))
        elif parts[0] == P.stage_dir(P.GROUP_CHECKPOINT_DIR):
            excluded.append((rel, path, "engine checkpoint of a cell (its tables are bundled under results/runs/)"))
        else:
            included.append((rel, path))
    return included, excluded


def excluded_table(excluded: list[tuple[str, Path, str]]) -> bytes:
    """TSV of the excluded files: path, bytes, sha256, reason."""
    lines = ["path\tbytes\tsha256\treason"]
    for rel, path, reason in excluded:
        lines.append(f"results/{rel}\t{path.stat().st_size}\t{sha256_file(path)}\t{reason}")
    return ("\n".join(lines) + "\n").encode()


def cells_provenance(results: Path) -> pd.DataFrame:
    """Engine versions and hardware of every cell, one row per ``summary.parquet`` under runs/ and breakdown/.

    ``kind`` is ``run`` (timed cell) or ``breakdown`` (re-run with stage timing); ``source`` is the
    summary's path in the bundle; ``measured`` the summary's (true where it has none). Columns a
    summary lacks are left empty.
    """
    import pandas as pd

    columns = ["kind", *CELL_KEYS, *CELL_EXTRA, *PROVENANCE_COLUMNS, "source", MEASURED]
    rows = []
    for kind, sub in (("run", P.stage_dir(P.CELL_DIR)), ("breakdown", P.stage_dir(P.BREAKDOWN_DIR))):
        for rel, path in _walk_files(results / sub) if (results / sub).is_dir() else ():
            if PurePosixPath(rel).name != "summary.parquet":
                continue
            summary = pd.read_parquet(path)
            for record in summary.to_dict("records"):
                row = {c: record.get(c) for c in columns}
                row.update(kind=kind, source=f"results/{sub}/{rel}", measured=record.get(MEASURED, True) is not False)
                rows.append(row)
    if not rows:
        log.warning("no summary.parquet under %s/runs or %s/breakdown: empty cell provenance", results, results)
    table = pd.DataFrame(rows, columns=columns)
    for c in columns:
        if c == MEASURED:
            table[c] = table[c].astype(bool)
        else:
            table[c] = pd.to_numeric(table[c]).astype("Int64") if c in _INT_COLUMNS else table[c].astype("string")
    return table.sort_values(["kind", *CELL_KEYS], kind="stable").reset_index(drop=True)


def _parquet_bytes(df: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    df.to_parquet(buf, index=False, engine="pyarrow", compression="zstd")
    return buf.getvalue()


def load_container_images(path: Path) -> list[dict[str, str]]:
    """The images of ``containers/images.yaml`` (validated by :mod:`sdbench.containers`), sorted by name.

    Each: ``key`` (image name, its SIF is ``containers/sif/<key>.sif``), ``kind``, ``vllm_version``,
    and its digest-pinned base split by :func:`sdbench.crate.image_reference`. A missing file gives [].
    """
    from sdbench.containers import load_images

    if not path.exists():
        log.info("%s absent: the bundle lists no container images", path)
        return []
    images = []
    for spec in load_images(path).images:
        images.append(
            {
                "key": spec.name,
                "kind": spec.kind,
                "vllm_version": spec.vllm_version or "",
                "base": spec.base,
                **{f"base_{k}": v for k, v in image_reference(spec.base).items()},
            }
        )
    return sorted(images, key=lambda i: i["key"])


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=timezone.utc).isoformat(timespec="seconds")


@dataclasses.dataclass(frozen=True)
class RunRecords:
    """What Snakemake recorded for the jobs of a run."""

    start_time: str | None = None
    end_time: str | None = None
    containers: tuple[str, ...] = ()


def read_snakemake_records(snakemake_dir: Path, files: Iterable[Path]) -> RunRecords:
    """Earliest start, latest end (ISO 8601, UTC) and container images of the jobs that wrote ``files``.

    Reads the file-backed metadata store (``.snakemake/metadata``: one JSON record per output, named by
    the urlsafe base64 of the path relative to the working directory, split at NAME_MAX). A file inside
    a directory output is looked up through its parents. Empty when nothing is recorded.
    """
    meta = snakemake_dir / "metadata"
    if not meta.is_dir():
        log.info("%s absent: run times and container images unknown", meta)
        return RunRecords()
    workdir = snakemake_dir.resolve().parent
    max_len = os.pathconf(meta, "PC_NAME_MAX") or 255
    starts, ends, containers = [], [], set()
    seen: set[str] = set()
    for f in files:
        rel = Path(os.path.relpath(Path(f).resolve(), workdir))
        for key in [rel.as_posix(), *(p.as_posix() for p in rel.parents if p.as_posix() != ".")]:
            if key in seen:
                break
            seen.add(key)
            b64 = urlsafe_b64encode(key.encode()).decode()
            chunks = [b64[i : i + max_len - 1] for i in range(0, len(b64), max_len - 1)]
            record = meta.joinpath(*["@" + c for c in chunks[:-1]], chunks[-1])
            if record.is_file():
                data = json.loads(record.read_text())
                if data.get("starttime"):
                    starts.append(data["starttime"])
                if data.get("endtime"):
                    ends.append(data["endtime"])
                if data.get("container_img_url"):
                    containers.add(str(data["container_img_url"]))
                break
    return RunRecords(
        start_time=_iso(min(starts)) if starts else None,
        end_time=_iso(max(ends)) if ends else None,
        containers=tuple(sorted(containers)),
    )


def installed_packages_digest() -> str:
    """Short digest of this interpreter's installed distributions (name==version, sorted)."""
    from importlib import metadata

    names = sorted(f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions())
    return hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]


def manifest_text(digests: dict[str, str]) -> str:
    """sha256sum-format manifest, sorted by path."""
    return "".join(f"{digests[name]}  {name}\n" for name in sorted(digests))


def _tarinfo(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, TAR_MTIME, 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def write_archive(members: list[Member], output: Path) -> None:
    """Write ``members`` (sorted) under ``BUNDLE_ROOT/`` into a deterministic .tar.gz, atomically."""
    with atomic_path(output) as tmp, open(tmp, "wb") as raw:
        # filename="" and mtime=0: the gzip header would otherwise record the temporary name and the clock.
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz:
            with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for m in sorted(members, key=lambda m: m.arcname):
                    with m.open() as fh:
                        tar.addfile(_tarinfo(f"{BUNDLE_ROOT}/{m.arcname}", m.size()), fh)
        # A shared artifact: the umask's permissions, not mkstemp's owner-only 0600.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)


def create_bundle(
    output: Path,
    results: Path,
    workflow: Path,
    workflow_files: Iterable[Path] = (),
    report: Path | None = None,
    config: Path | None = None,
    containers: Path | None = None,
    environments: dict[str, Path] | None = None,
    snakemake_dir: Path | None = None,
    containers_used: bool = False,
    start_time: str | None = None,
    end_time: str | None = None,
    date_published: str | None = None,
    allow_rehearsal: bool = False,
) -> int:
    """Write the bundle to ``output``; returns the number of files the manifest lists.

    A run with rehearsal cells raises :class:`sdbench.errors.RehearsalError` unless ``allow_rehearsal``.

    ``containers_used``: the jobs ran in the images Snakemake recorded for them (``--sdm apptainer``);
    Snakemake records a rule's declared image either way, so only then are they the run's images.
    """
    members: dict[str, Member] = {}

    def add(member: Member) -> str:
        _check_arcname(member.arcname)
        if member.arcname in members:
            raise ConfigError(f"{member.arcname}: two inputs map to the same path in the bundle")
        members[member.arcname] = member
        return member.arcname

    for label, path in (("--workflow", workflow), ("--report", report), ("--config", config)):
        if path is not None and not Path(path).is_file():
            raise ConfigError(f"{label} {path}: no such file")
    base = workflow.resolve().parent
    wf_name = add(Member(workflow.resolve().relative_to(base).as_posix(), source=workflow))
    parts = []
    for item in map(Path, workflow_files):
        if not item.exists():
            raise ConfigError(f"--workflow-files {item}: no such file or directory")
        for path in [p for _, p in _walk_files(item)] if item.is_dir() else [item]:
            resolved = path.resolve()
            if not resolved.is_relative_to(base):
                raise ConfigError(f"--workflow-files {path}: outside the workflow directory {base}")
            rel = resolved.relative_to(base)
            # Byte-compiled and hidden files are not workflow source.
            if "__pycache__" in rel.parts or any(p.startswith(".") for p in rel.parts) or rel.as_posix() == wf_name:
                continue
            parts.append(add(Member(rel.as_posix(), source=path)))
    config_name = add(Member(f"config/{config.name}", source=config)) if config else None
    report_name = add(Member(f"report/{report.name}", source=report)) if report else None
    images, containers_name = [], None
    if containers is not None:
        images = load_container_images(containers)
        if containers.exists():
            containers_name = add(Member("containers/images.yaml", source=containers))
    env_names = {}
    for env, path in sorted((environments or {}).items()):
        if not _ENV_NAME.match(env):
            raise ConfigError(f"--environment {env}={path}: NAME must match {_ENV_NAME.pattern}")
        if not path.is_file():
            raise ConfigError(f"--environment {env}={path}: no such file")
        env_names[env] = add(Member(f"environments/{env}.txt", source=path))

    included, excluded = collect_results(results)
    result_names = [add(Member(f"results/{rel}", source=path)) for rel, path in included]
    cells = cells_provenance(results)
    if not allow_rehearsal:
        refuse_rehearsal([(str(results), rehearsal_rows(cells), len(cells))], "bundle them")
    provenance = [
        add(Member("provenance/cells.parquet", data=_parquet_bytes(cells))),
        add(Member("provenance/excluded.tsv", data=excluded_table(excluded))),
    ]
    records = RunRecords()
    if snakemake_dir is not None:
        records = read_snakemake_records(snakemake_dir, [p for _, p in included])
    start_time, end_time = start_time or records.start_time, end_time or records.end_time
    if date_published is None and os.environ.get("SOURCE_DATE_EPOCH"):
        date_published = _iso(int(os.environ["SOURCE_DATE_EPOCH"]))
    date_published = date_published or end_time

    digests = {}
    for name, m in members.items():
        with m.open() as fh:
            digests[name] = sha256_stream(fh)
    info = CrateInfo(
        workflow=wf_name,
        workflow_parts=sorted(parts),
        config=config_name,
        report=report_name,
        results=result_names,
        environments=env_names,
        provenance=provenance,
        containers_file=containers_name,
        images=images,
        cells=cells,
        start_time=start_time,
        end_time=end_time,
        date_published=date_published,
        containers_used=records.containers if containers_used else (),
    )
    all_members = list(members.values())
    crate = Member(CRATE_METADATA, data=build_crate(all_members, digests, info))
    add(crate)
    digests[CRATE_METADATA] = hashlib.sha256(crate.data or b"").hexdigest()
    add(Member(MANIFEST, data=manifest_text(digests).encode()))
    write_archive(list(members.values()), output)
    log.info(
        "%s: %d files (%d excluded from results/, see provenance/excluded.tsv)", output, len(digests), len(excluded)
    )
    return len(digests)


# --- verification -----------------------------------------------------------------------------------


def parse_manifest(text: str) -> dict[str, str]:
    """``path -> sha256`` of a sha256sum-format manifest; raises ValueError naming a bad line."""
    out = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        digest, sep, name = line.partition(" ")
        name = name[1:] if name[:1] in (" ", "*") else name
        if not sep or not _HEX64.match(digest) or not name:
            raise ValueError(f"{MANIFEST} line {lineno}: not '<sha256>  <path>'")
        out[name] = digest
    return out


def _bundle_dir(path: Path) -> Path:
    # An unpacked archive: accept the extraction directory as well as the bundle root inside it.
    if (path / MANIFEST).exists() or not (path / BUNDLE_ROOT / MANIFEST).exists():
        return path
    return path / BUNDLE_ROOT


def _read_directory(path: Path) -> tuple[dict[str, str], dict[str, bytes], list[str]]:
    """(path -> sha256 of every regular file, the manifest and crate bytes, irregular entries)."""
    root = _bundle_dir(path)
    digests, special, irregular = {}, {}, []
    for rel, file in _walk_files(root):
        if file.is_symlink() or not file.is_file():
            irregular.append(rel)
            continue
        if rel in (MANIFEST, CRATE_METADATA):
            special[rel] = file.read_bytes()
        if rel != MANIFEST:
            digests[rel] = sha256_file(file)
    return digests, special, irregular


def _read_archive(path: Path) -> tuple[dict[str, str], dict[str, bytes], list[str]]:
    """As :func:`_read_directory`, streaming the members of a .tar(.gz) archive."""
    digests, special, irregular = {}, {}, []
    with tarfile.open(path, "r:*") as tar:
        members = tar.getmembers()
        roots = sorted(
            (m.name[: -len(MANIFEST)] for m in members if m.name == MANIFEST or m.name.endswith("/" + MANIFEST)),
            key=len,
        )
        prefix = roots[0] if roots else f"{BUNDLE_ROOT}/"
        for m in members:
            if m.isdir():
                continue
            rel = m.name[len(prefix) :] if m.name.startswith(prefix) else m.name
            if not m.isfile():
                irregular.append(rel)
                continue
            fh = tar.extractfile(m)
            assert fh is not None
            if rel in (MANIFEST, CRATE_METADATA):
                special[rel] = fh.read()
                fh = io.BytesIO(special[rel])
            if rel != MANIFEST:
                digests[rel] = sha256_stream(fh)
    return digests, special, irregular


def verify_bundle(path: Path) -> tuple[int, list[str]]:
    """Check a bundle (archive or unpacked directory): (number of manifest files, one line per problem)."""
    if path.is_dir():
        digests, special, irregular = _read_directory(path)
    elif path.is_file():
        try:
            digests, special, irregular = _read_archive(path)
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise ConfigError(f"{path}: not a readable tar archive ({exc})") from exc
    else:
        raise ConfigError(f"{path}: no such file or directory")
    if MANIFEST not in special:
        return 0, [f"MISSING: {MANIFEST}"]
    try:
        manifest = parse_manifest(special[MANIFEST].decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        return 0, [f"MALFORMED: {exc}"]
    problems = []
    for name in sorted(set(manifest) | set(digests)):
        if name not in digests:
            problems.append(f"MISSING: {name}")
        elif name not in manifest:
            problems.append(f"EXTRA: {name}")
        elif digests[name] != manifest[name]:
            problems.append(f"CHANGED: {name}")
    problems += [f"EXTRA (not a regular file): {name}" for name in sorted(irregular)]
    problems += crate_problems(special.get(CRATE_METADATA), manifest)
    return len(manifest), problems


# --- CLI --------------------------------------------------------------------------------------------


def _cmd_create(args: argparse.Namespace) -> int:
    envs = dict(args.environment or [])
    if len(envs) != len(args.environment or []):
        raise ConfigError("--environment: a NAME is given twice")
    n = create_bundle(
        output=args.output,
        results=args.results,
        workflow=args.workflow,
        workflow_files=args.workflow_files,
        report=args.report,
        config=args.config,
        containers=args.containers,
        environments=envs,
        snakemake_dir=args.snakemake_dir,
        containers_used=args.containers_used,
        start_time=args.start_time,
        end_time=args.end_time,
        date_published=args.date_published,
        allow_rehearsal=args.allow_rehearsal,
    )
    print(f"{args.output}: {n} files")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    n, problems = verify_bundle(args.path)
    for line in problems:
        print(line)
    if problems:
        print(f"FAILED: {len(problems)} problem(s) in {args.path}", file=sys.stderr)
        return 1
    print(f"OK: {n} files verified")
    return 0


def _cmd_config(args: argparse.Namespace) -> int:
    try:
        config = json.loads(args.json)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--json: not valid JSON ({exc})") from exc
    write_text(yaml.safe_dump(config, sort_keys=True, allow_unicode=True), args.output)
    return 0
