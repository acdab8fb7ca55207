"""``sdbench doctor``: check a site before a run, one line per check.

    sdbench doctor [--config CONFIG] [--profile PROFILE_DIR] [--offline]

Each line is ``check | ok``, ``check | FAILED: why | how to fix`` or ``check | skipped: why``;
the command exits 1 when any check failed. The config is read as the Snakefile reads it
(:func:`sdbench.config.load_config`, then :class:`sdbench.workflow.plan.Plan`), the profile as
Snakemake reads ``<PROFILE_DIR>/config.yaml``. The checks live in one room per site part, each
with its checks and their fixes, run in this order:

* the local machine (:mod:`sdbench.doctorlocal`): Python version (pyproject.toml's
  ``requires-python``), the venv made by ``scripts/bootstrap.sh`` (its stamp matches this
  checkout's lock), every pin of ``requirements/lock.txt`` installed at its version, Snakemake and
  the plugins the profile names (``executor: slurm`` needs ``snakemake-executor-plugin-slurm``);
* the config and its plan (:func:`config_check`, here);
* the GPUs (:mod:`sdbench.doctorgpu`, with CUDA engines): GPUs and a driver every engine image
  accepts; then the CPU (:mod:`sdbench.doctorlocal`, with CPU engines): the build of vLLM's CPU
  kernels this host loads; then NVML's energy counter read around ~2 s of matmuls on the first
  GPU, printed as joules and mean watts (the meter of every timed call, :mod:`sdbench.engine.measure.energy`);
* containers (:mod:`sdbench.doctorcontainers`, with ``software-deployment-method: apptainer``):
  Apptainer (or Singularity) and its version, every image the config needs built
  (``containers/sif/<name>.sif``) from the current definition with the labels of
  ``containers/images.yaml``, and for CUDA images the GPUs seen inside the image and the driver
  against the image's CUDA (:data:`sdbench.gpudriver.IMAGE_CUDA`);
* the hub (:mod:`sdbench.doctorhub`): the token against every repository the config downloads,
  and free disk for the snapshots (sizes from the hub's file lists; skipped with ``--offline`` or
  when the hub is unreachable);
* SLURM (:mod:`sdbench.doctorslurm`, with ``executor: slurm``): ``sinfo``/``scontrol`` answer, the
  profile's partitions exist, their MaxTime covers the longest runtime the plan asks
  (:mod:`sdbench.scheduling`, every retry included) and their GPUs (GRES) the ``gpu_model`` and
  tensor-parallel size of the engine jobs; the QOS and association limits ``sacctmgr`` holds cover
  the jobs.

Every check is a small function returning :class:`sdbench.doctorcore.Result` (or a list of them),
so tests call them one by one; :func:`run_checks` runs them in order and :func:`_cmd_doctor` prints
them. A new check goes in the room of its site part, and its call in :func:`run_checks`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sdbench import doctormeters
from sdbench.cli import one_line
from sdbench.doctorcontainers import apptainer_checks
from sdbench.doctorcore import Result, failed, ok
from sdbench.doctorgpu import energy_meter_checks, host_gpu_checks
from sdbench.doctorhub import hub_checks
from sdbench.doctorlocal import (
    LOCK,
    cpu_kernel_checks,
    load_profile,
    pinned_packages,
    project_venv,
    python_version,
    snakemake_plugins,
)
from sdbench.doctorsite import Site
from sdbench.doctorslurm import slurm_checks

DEFAULT_CONFIG = Path("config/config.yaml")


def config_check(site: Site) -> Result:
    """The config validates as the Snakefile validates it, and the plan builds."""
    from sdbench.config import load_config
    from sdbench.workflow.plan import Plan

    check = f"config {site.config_path}"
    try:
        site.config = load_config(site.root / site.config_path)
        if site.profile_dir is not None and site.profile.get("config"):  # a site's limits, as snakemake and
            import yaml  # check-config apply them (the SLURM profiles' site block)

            from sdbench.config import validate_config
            from sdbench.workflow.plan import profile_config

            raw = yaml.safe_load((site.root / site.config_path).read_text())
            site.config = validate_config({**raw, **profile_config(str(site.profile_dir))},
                                          source=f"{site.config_path} + {site.profile_dir}")  # fmt: skip
        site.plan = Plan(site.config)
    except (ValueError, OSError) as exc:  # a bad config (ConfigError): every error names its key
        return failed(check, one_line(str(exc)), "fix the named key (docs/configuration.md)")
    return ok(f"{check} ({len(site.plan.cells)} cells)")


def run_checks(site: Site) -> list[Result]:
    """Every check, in order."""
    results = [python_version(site.root / "pyproject.toml"), project_venv(site.root)]
    results += pinned_packages(site.root / LOCK)
    results += snakemake_plugins(site.profile)
    results.append(config_check(site))
    results += host_gpu_checks(site)
    results += cpu_kernel_checks(site)
    results += energy_meter_checks(site)
    results += doctormeters.meter_checks(site)  # the CPU engines' meter (RAPL)
    results += apptainer_checks(site)
    results += hub_checks(site)
    results += slurm_checks(site)
    results += __import__("sdbench.doctorcostmodel").doctorcostmodel.cost_model_checks(site)  # --cost-model
    return results


def _cmd_doctor(args: argparse.Namespace) -> int:
    root = Path.cwd()
    if not (root / "Snakefile").is_file() or not (root / LOCK).is_file():
        raise SystemExit(f"sdbench doctor: {root} is not an sdbench checkout (no Snakefile, {LOCK}): run it from the "
                         "checkout's top directory, where snakemake runs")
    profile_dir = Path(args.profile) if args.profile else None
    profile = load_profile(profile_dir)
    configfile = profile.get("configfile")
    config_path = Path(args.config or (configfile if isinstance(configfile, str) else None) or DEFAULT_CONFIG)
    site = Site(root=root, config_path=config_path, profile_dir=profile_dir, profile=profile, offline=args.offline)
    site.cost_model = getattr(args, "cost_model", None)  # sdbench.doctorcostmodel
    results = run_checks(site)
    for result in results:
        print(result.line(), flush=True)
    bad = sum(r.failed for r in results)
    # The summary goes to stderr: stdout holds only check lines.
    print(f"doctor: {bad} of {len(results)} checks FAILED" if bad else f"doctor: {len(results)} checks, none failed",
          file=sys.stderr)
    return 1 if bad else 0
