"""SLURM accounting limits for ``sdbench doctor`` (``executor: slurm``): what ``sacctmgr`` holds
for the QOS and associations the jobs run under, against what the plan's jobs ask.

A job's QOS: its rule's ``qos`` resource (the slurm plugin's ``--qos``), the profile's ``slurm-qos``,
else its association's default; the partition's QOS (``scontrol``'s ``QoS=``) applies on top. Its
association: the user's row of its ``slurm_account`` for its partition (else for all). Per QOS and
association: MaxWall against each job's runtime at its last retry; MaxTRES ``gres/gpu`` against its
GPUs; MaxSubmitPU / MaxSubmit against the jobs Snakemake keeps submitted (the profile's ``jobs:``; a
warning); GrpTRESRunMins ``gres/gpu`` as a budget (one job above it never starts; jobs in flight
above it wait, said in the ok line). Without ``sacctmgr``, or when it answers with an error (no
accounting database), one ``skipped`` line.
"""

from __future__ import annotations

import getpass
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sdbench.doctorcore import (
    Result,
    failed,
    ok,
    parse_slurm_minutes,
    profile_minutes,
    resource_map,
    run_command,
    set_resources,
    skipped,
)

ASSOC_FIELDS = ("Account", "Partition", "QOS", "DefaultQOS", "MaxWall", "MaxTRES", "MaxSubmit", "GrpTRESRunMins")
QOS_FIELDS = ("Name", "MaxWall", "MaxTRES", "MaxSubmitPU", "GrpTRESRunMins")
CHECK = "slurm accounting limits (sacctmgr)"


@dataclass(frozen=True)
class Job:
    """``count`` jobs of one rule that ask alike (None: every job of a rule the plan does not list
    one by one), runtime in minutes at the first and last attempt, GPUs, QOS and account asked."""

    rule: str
    partition: str
    minutes: int
    minutes_last: int
    gpus: int = 0
    gpu_model: str | None = None
    count: int | None = 1
    qos: str | None = None
    account: str | None = None


def plan_jobs(config: Mapping[str, Any], plan: Any, profile: Mapping[str, Any]) -> list[Job]:
    """Every engine job of the plan (as :func:`sdbench.doctor.job_asks` sizes them, one by one) and
    one entry per other rule the profile sizes."""
    from sdbench import scheduling
    from sdbench.workflow.plan import NETWORK_RULES

    config = dict(config)
    defaults = resource_map(profile.get("default-resources"))
    per_rule = set_resources(profile)
    attempts = int(profile.get("retries", 0)) + 1
    engine: dict[str, list[tuple[Any, Any, Any]]] = {
        "run_engine": [(scheduling.group_runtime_minutes, cs, max(cs, key=lambda c: c.batch_size))
                       for cs in plan.groups.values()],
        "trace_group": [(scheduling.trace_runtime_minutes, plan.trace_cells(g), plan.trace_cells(g)[0])
                        for g in plan.trace_groups],
        "breakdown_group": [(scheduling.breakdown_runtime_minutes, cs, cs[0])
                            for cs in plan.breakdown_groups.values()],
        "serve_group": [(scheduling.server_runtime_minutes, plan.server_cell(g), plan.server_cell(g))
                        for g in plan.server_groups],
    }  # fmt: skip

    def job(rule: str, first: int, last: int, gpus: int, count: int | None) -> Job:
        res = {**defaults, **per_rule.get(rule, {})}
        qos = res.get("qos", profile.get("slurm-qos"))
        model = res.get("gpu_model") if gpus else None
        return Job(rule, str(res.get("slurm_partition", "")), first, last, gpus, model, count,
                   None if qos is None else str(qos), res.get("slurm_account"))  # fmt: skip

    jobs = []
    for rule, groups in engine.items():
        fixed = per_rule.get(rule, {}).get("runtime")
        for runtime, cells, widest in groups:
            first, last = ((profile_minutes(fixed),) * 2 if fixed is not None
                           else (runtime(config, cells, 1), runtime(config, cells, attempts)))  # fmt: skip
            jobs.append(job(rule, first, last, scheduling.cell_gpus(config, widest), 1))
    # Network rules run on the submitting host, never through sbatch; "every other job": the defaults.
    sized = [(r, res["runtime"]) for r, res in sorted(per_rule.items())
             if r not in engine and r not in NETWORK_RULES and "runtime" in res]  # fmt: skip
    for rule, runtime in sized + ([("every other job", defaults["runtime"])] if "runtime" in defaults else []):
        jobs.append(job(rule, profile_minutes(runtime), profile_minutes(runtime), 0, None))
    return jobs


# --- parsing (pure) ------------------------------------------------------------------------------


def parse_rows(text: str, fields: Sequence[str]) -> list[dict[str, str]]:
    """``sacctmgr --noheader --parsable2 ... format=<fields>`` output as one mapping per row."""
    return [dict(zip(fields, line.split("|"), strict=False)) for line in text.splitlines() if line.strip()]


def parse_tres(text: str) -> dict[str, int]:
    """A TRES list, ``cpu=64,gres/gpu=4,gres/gpu:h100=2`` -> {name: count}; ValueError names a bad item."""
    out = {}
    for item in filter(None, (i.strip() for i in text.split(","))):
        name, _, value = item.partition("=")
        if not value.isdigit():
            raise ValueError(f"TRES item {item!r} of {text!r}: expected <name>=<count>")
        out[name] = int(value)
    return out


def gpu_limit(tres: Mapping[str, int], gpu_model: str | None) -> int | None:
    """The GPUs a TRES limit allows a job of ``gpu_model`` (``gres/gpu``, ``gres/gpu:<model>``)."""
    limits = [n for key, n in tres.items() if key == "gres/gpu" or (gpu_model and key == f"gres/gpu:{gpu_model}")]
    return min(limits) if limits else None


def _total(jobs: Sequence[Job]) -> int:
    return sum(j.count or 0 for j in jobs)


# --- verdicts (pure) -----------------------------------------------------------------------------


def maxwall(where: str, raw: str, jobs: Sequence[Job], profile_file: str) -> Result:
    """No job asks more than MaxWall, at any retry."""
    limit = parse_slurm_minutes(raw)
    check = f"{where} MaxWall {raw}"
    over = [j for j in jobs if limit is not None and j.minutes_last > limit]
    if not over:
        return ok(check)
    top = max(over, key=lambda j: j.minutes_last)
    counted, wide = [j for j in over if j.count], sorted({j.rule for j in over if not j.count})
    parts = [f"{_total(counted)} of {_total(jobs)} engine jobs"] if counted else []
    parts += [f"every {r} job" if r != "every other job" else r for r in wide]
    first = f"; {top.minutes} min at the first" if top.minutes != top.minutes_last else ""
    why = f"{' and '.join(parts)} ask more than {raw} by their last attempt (largest {top.minutes_last} min, "
    why += f"{top.rule}{first})"
    fixes = [f"lower the site block's max_runtime of partition {p} to {limit:.0f} in {profile_file} (engine groups "
             "are split to fit)" for p in sorted({j.partition for j in counted})]  # fmt: skip
    fixes += [f"set runtime <= {limit:.0f} for {', '.join(wide)} in {profile_file}"] if wide else []
    return failed(check, why, "; ".join(fixes) + f", or ask for {'a QOS' if 'QOS' in where else 'an association'} "
                  "with a longer MaxWall")  # fmt: skip


def max_gpus(where: str, raw: str, jobs: Sequence[Job]) -> Result | None:
    """No job asks more GPUs than MaxTRES allows (None: no GPU limit in it)."""
    tres = parse_tres(raw)
    if not any(k.startswith("gres/gpu") for k in tres):
        return None
    check = f"{where} MaxTRES {raw}"
    over = [j for j in jobs if j.gpus and (n := gpu_limit(tres, j.gpu_model)) is not None and j.gpus > n]
    if not over:
        return ok(check)
    top = max(over, key=lambda j: j.gpus)
    why = f"{_total(over)} of {_total(jobs)} engine jobs ask more GPUs (largest {top.gpus}, {top.rule})"
    return failed(check, why, "a smaller tensor_parallel_size, or a QOS / association allowing as many GPUs per job")


def max_submit(where: str, field: str, raw: str, jobs: Sequence[Job], at_once: int | None,
               profile_file: str) -> Result:  # fmt: skip
    """The jobs Snakemake keeps submitted (``jobs:``) fit the submit limit."""
    limit = int(raw)
    check = f"{where} {field} {limit}"
    submitted = at_once if at_once is not None else _total(jobs)
    if all(j.count for j in jobs):  # every job counted: no more than the plan has
        submitted = min(submitted, _total(jobs))
    if submitted <= limit:
        return ok(check)
    cap = f"the profile's jobs: {at_once}" if at_once is not None else "the profile sets no jobs:"
    return failed(check, f"Snakemake keeps up to {submitted} jobs submitted ({cap}; {_total(jobs)} engine jobs), "
                  f"sbatch refuses those beyond {limit} and Snakemake counts them failed (a warning: how many are "
                  "ready at once depends on the DAG)",
                  f"set jobs: {limit} (fewer if you run other jobs there) in {profile_file}")  # fmt: skip


def run_mins(where: str, raw: str, jobs: Sequence[Job], at_once: int | None) -> Result | None:
    """GrpTRESRunMins gres/gpu as a budget: one job above it never starts; the jobs in flight above
    it wait their turn (told in the ok line). None: no GPU budget in it."""
    budget = parse_tres(raw).get("gres/gpu")
    gpu_jobs = [j for j in jobs if j.gpus for _ in range(j.count or 1)]
    if budget is None or not gpu_jobs:
        return None
    top = max(gpu_jobs, key=lambda j: j.gpus * j.minutes_last)
    asks = sorted((j.gpus * j.minutes for j in gpu_jobs), reverse=True)[: at_once or len(gpu_jobs)]
    check = f"{where} GrpTRESRunMins gres/gpu={budget}"
    if top.gpus * top.minutes_last > budget:
        asked = f"{top.gpus} GPU(s) x {top.minutes_last} min = {top.gpus * top.minutes_last} GPU-min"
        fix = "lower max_runtime in the site block (or the GPUs per job), or ask for a larger GrpTRESRunMins"
        return failed(check, f"a {top.rule} job asks {asked}, more than the whole budget: it never starts", fix)
    wait = "; beyond the budget they wait their turn" if sum(asks) > budget else ""
    return ok(f"{check} (largest job {top.gpus * top.minutes_last} GPU-min; {len(asks)} job(s) in flight: "
              f"{sum(asks)} GPU-min{wait})")  # fmt: skip


def limit_checks(where: str, limits: Mapping[str, str], submit_field: str, jobs: Sequence[Job],
                 at_once: int | None, profile_file: str) -> list[Result]:  # fmt: skip
    """Every limit that is set in ``limits`` (one row of ``sacctmgr``), against ``jobs``."""
    verdicts: dict[str, Callable[[str], Result | None]] = {
        "MaxWall": lambda raw: maxwall(where, raw, jobs, profile_file),
        "MaxTRES": lambda raw: max_gpus(where, raw, jobs),
        submit_field: lambda raw: max_submit(where, submit_field, raw, jobs, at_once, profile_file),
        "GrpTRESRunMins": lambda raw: run_mins(where, raw, jobs, at_once),
    }
    results = []
    for key, verdict in verdicts.items():
        try:
            results.append(verdict(limits[key]) if limits.get(key) else None)
        except ValueError as exc:  # sacctmgr answered something this does not read
            results.append(skipped(f"{where} {key}", f"sacctmgr's {key}={limits[key]!r} does not parse: {exc}"))
    found = [r for r in results if r is not None]
    return found or [ok(f"{where}: no MaxWall, GPU MaxTRES, {submit_field} or GPU GrpTRESRunMins limit")]


# --- asking sacctmgr -----------------------------------------------------------------------------


def sacctmgr(args: Sequence[str], fields: Sequence[str]) -> list[dict[str, str]] | str:
    """Rows of ``sacctmgr --noheader --parsable2 show ARGS format=FIELDS``, or why there are none."""
    cmd = ["sacctmgr", "--noheader", "--parsable2", "show", *args, "format=" + ",".join(fields)]
    out = run_command(cmd)
    if out.returncode == 127:
        return "sacctmgr is not on PATH: no accounting limits to check"
    if out.returncode != 0:
        said = " ".join(ln.strip() for ln in (out.stderr or out.stdout).splitlines() if ln.strip())
        return f"`sacctmgr show {args[0]}` exited {out.returncode}: {said or 'no message'}"
    return parse_rows(out.stdout, fields)


def accounting_checks(profile: Mapping[str, Any], profile_dir: Path | None, jobs: Sequence[Job],
                      partitions: Mapping[str, Mapping[str, str]], user: str | None = None,
                      ) -> list[Result]:  # fmt: skip
    """The limits of every QOS and association the jobs run under (module docstring)."""
    user = user or getpass.getuser()
    profile_file = f"{profile_dir}/config.yaml" if profile_dir else "the profile"
    at_once = int(profile["jobs"]) if str(profile.get("jobs", "")).isdigit() else None
    rows = sacctmgr(["assoc", "where", f"user={user}"], ASSOC_FIELDS)
    if isinstance(rows, str):
        return [skipped(CHECK, rows)]
    results: list[Result] = []
    by_assoc: dict[tuple[str, str], tuple[Mapping[str, str], list[Job]]] = {}
    by_qos: dict[str, list[Job]] = {}
    no_qos: set[str] = set()
    no_assoc: set[str] = set()
    for job in jobs:  # the accounting database keeps names in lower case
        mine = [r for r in rows if not job.account or r.get("Account") == job.account.lower()]
        row = next((r for r in mine if r.get("Partition") == job.partition.lower()), None) or next(
            (r for r in mine if not r.get("Partition")), None)  # fmt: skip
        if row is not None:
            by_assoc.setdefault((row.get("Account", ""), row.get("Partition", "")), (row, []))[1].append(job)
        elif rows:
            no_assoc.add(f"{job.account or '<default account>'} (partition {job.partition or '<default>'})")
        allowed = [q for q in (row or {}).get("QOS", "").split(",") if q]
        qos = job.qos or (row or {}).get("DefaultQOS") or (allowed[0] if len(allowed) == 1 else None)
        part_qos = partitions.get(job.partition, {}).get("QoS", "N/A")
        for name in {qos, None if part_qos in ("N/A", "") else part_qos} - {None}:
            by_qos.setdefault(str(name).lower(), []).append(job)
        if qos is None:
            no_qos.add(job.rule)
    accounts = ", ".join(sorted({r.get("Account", "") for r in rows})) or "none"
    if not rows:
        results.append(skipped(f"slurm associations of {user}", "sacctmgr lists none: no association limits"))
    for account in sorted(no_assoc):
        why = "sacctmgr lists no such association (sbatch refuses its jobs)"
        results.append(failed(f"slurm association {user}/{account}", why, f"set slurm_account in {profile_file} "
                              f"to one of {accounts}"))  # fmt: skip
    for (account, partition), (row, its) in by_assoc.items():
        where = f"slurm association {user}/{account}" + (f"/{partition}" if partition else "")
        results += limit_checks(where, row, "MaxSubmit", its, at_once, profile_file)
    if no_qos:
        why = f"neither the profile (qos, slurm-qos) nor {user}'s association names one"
        results.append(skipped(f"slurm QOS of {', '.join(sorted(no_qos))} jobs", why))
    if not by_qos:
        return results
    qos_rows = sacctmgr(["qos", "where", "name=" + ",".join(sorted(by_qos))], QOS_FIELDS)
    if isinstance(qos_rows, str):
        return results + [skipped("slurm QOS limits", qos_rows)]
    known = {r.get("Name", ""): r for r in qos_rows}
    for name, its in sorted(by_qos.items()):
        if name in known:
            results += limit_checks(f"slurm QOS {name}", known[name], "MaxSubmitPU", its, at_once, profile_file)
            continue
        mine = sorted({q for r in rows for q in r.get("QOS", "").split(",") if q})
        fix = f"set qos in {profile_file} to one of {user}'s: {', '.join(mine) or 'none'}"
        results.append(failed(f"slurm QOS {name}", "sacctmgr knows no such QOS (sbatch refuses the jobs)", fix))
    return results


def site_checks(config: Mapping[str, Any] | None, plan: Any, profile: Mapping[str, Any], profile_dir: Path | None,
                partitions: Mapping[str, Mapping[str, str]]) -> list[Result]:  # fmt: skip
    """:func:`accounting_checks` of a config's plan under a profile (``doctor.slurm_checks`` calls it)."""
    if config is None:  # the config failed its own check: no plan to compare
        return []
    return accounting_checks(profile, profile_dir, plan_jobs(config, plan, profile), partitions)
