"""``sdbench doctor``, SLURM (``executor: slurm``): ``sinfo``/``scontrol`` answer, the partitions the
profile names exist, their MaxTime covers the longest runtime the plan asks (:mod:`sdbench.scheduling`,
every retry included) and their GPUs (GRES) the ``gpu_model`` and tensor-parallel size of the engine
jobs (:func:`slurm_checks`); then the accounting limits ``sacctmgr`` holds (:func:`site_checks`).

The accounting limits are what ``sacctmgr`` holds for the QOS and associations the jobs run under,
against what the plan's jobs ask.

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
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sdbench.doctorcore import (
    OK,
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
from sdbench.doctorsite import Site
from sdbench.gpudriver import first_line as _first_line

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
    """Every engine job of the plan (as :func:`job_asks` sizes them, one by one) and
    one entry per other rule the profile sizes."""
    from sdbench import scheduling
    from sdbench.workflow.rulenames import NETWORK_RULES

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
    """:func:`accounting_checks` of a config's plan under a profile (:func:`slurm_checks` calls it)."""
    if config is None:  # the config failed its own check: no plan to compare
        return []
    return accounting_checks(profile, profile_dir, plan_jobs(config, plan, profile), partitions)


# --- partitions: exist, MaxTime, GPUs ------------------------------------------------------------


# Engine rules: they run in the engine's image and ask for GPUs and the plan's runtime
# (workflow/rules/{runs,acceptance,breakdown,server}.smk).
ENGINE_RULES = ("run_engine", "trace_group", "breakdown_group", "serve_group")


def slurm_partitions() -> dict[str, dict[str, str]] | str:
    """``scontrol show partition -o`` as name -> fields, or why SLURM did not answer."""
    out = run_command(["scontrol", "show", "partition", "-o"])
    if out.returncode != 0:
        return f"`scontrol show partition` exited {out.returncode}: {_first_line(out.stderr or out.stdout)}"
    parts: dict[str, dict[str, str]] = {}
    for line in out.stdout.splitlines():
        fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        if "PartitionName" in fields:
            parts[fields["PartitionName"]] = fields
    return parts


def slurm_gres(partition: str) -> list[str] | str:
    """GRES of the partition's node groups (``sinfo -h -p P -o %G``), or why sinfo failed."""
    out = run_command(["sinfo", "-h", "-p", partition, "-o", "%G"])
    if out.returncode != 0:
        return f"`sinfo` exited {out.returncode}: {_first_line(out.stderr or out.stdout)}"
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def slurm_reachable() -> Result:
    """``sinfo`` answers (a controller is reachable from here)."""
    out = run_command(["sinfo", "-h", "-o", "%P"])
    if out.returncode != 0:
        return failed("slurm: sinfo answers", _first_line(out.stderr or out.stdout) or f"exit {out.returncode}",
                      "run on a login node of the cluster (sinfo, sbatch on PATH; SLURM_CONF if the site needs it)")
    return ok("slurm: sinfo answers")


@dataclass(frozen=True)
class JobAsk:
    """What one rule's jobs ask of SLURM: partition, the longest runtime (minutes, first attempt
    and last retry) and GPUs per job with their type."""

    rule: str
    partition: str
    minutes: int
    minutes_last: int
    attempts: int
    gpus: int = 0
    gpu_model: str | None = None


def job_asks(config: Mapping[str, Any], plan: Any, profile: Mapping[str, Any]) -> list[JobAsk]:
    """Per engine rule with jobs (and per other rule the profile sizes, and every other job),
    the partition and the longest runtime and most GPUs it asks, as the workflow computes them."""
    from sdbench import scheduling

    config = dict(config)
    defaults = resource_map(profile.get("default-resources"))
    per_rule = set_resources(profile)
    attempts = int(profile.get("retries", 0)) + 1

    def _runtime_of(rule: str, computed: Callable[[int], int] | None) -> tuple[int, int]:
        fixed = per_rule.get(rule, {}).get("runtime")
        if fixed is None and computed is None:
            fixed = defaults.get("runtime")
        if fixed is not None:
            minutes = profile_minutes(fixed)
            return minutes, minutes
        assert computed is not None
        return computed(1), computed(attempts)

    engine_jobs: dict[str, list[tuple[Callable[[int], int], int]]] = {
        "run_engine": [
            (lambda a, cs=cs: scheduling.group_runtime_minutes(config, cs, a),
             scheduling.cell_gpus(config, max(cs, key=lambda c: c.batch_size)))
            for cs in plan.groups.values()
        ],
        "trace_group": [
            (lambda a, cs=plan.trace_cells(g): scheduling.trace_runtime_minutes(config, cs, a),
             scheduling.cell_gpus(config, plan.trace_cells(g)[0]))
            for g in plan.trace_groups
        ],
        "breakdown_group": [
            (lambda a, cs=cs: scheduling.breakdown_runtime_minutes(config, cs, a),
             scheduling.cell_gpus(config, cs[0]))
            for cs in plan.breakdown_groups.values()
        ],
        "serve_group": [
            (lambda a, c=plan.server_cell(g): scheduling.server_runtime_minutes(config, c, a),
             scheduling.cell_gpus(config, plan.server_cell(g)))
            for g in plan.server_groups
        ],
    }
    asks = []
    for rule, jobs in engine_jobs.items():
        if not jobs:
            continue
        res = {**defaults, **per_rule.get(rule, {})}
        first, last = 0, 0
        for runtime, _ in jobs:
            a, b = _runtime_of(rule, runtime)
            first, last = max(first, a), max(last, b)
        gpus = max(g for _, g in jobs)
        asks.append(JobAsk(rule, str(res.get("slurm_partition", "")), first, last, attempts, gpus,
                           res.get("gpu_model") if gpus else None))
    from sdbench.workflow.rulenames import NETWORK_RULES

    for rule, res in sorted(per_rule.items()):
        # Network rules are local rules: they run on the submitting host, never through sbatch.
        if rule in ENGINE_RULES or rule in NETWORK_RULES or "runtime" not in res:
            continue
        minutes, _ = _runtime_of(rule, None)
        asks.append(JobAsk(rule, str({**defaults, **res}.get("slurm_partition", "")), minutes, minutes, attempts))
    if defaults.get("runtime") is not None:
        minutes, _ = _runtime_of("*", None)
        asks.append(JobAsk("every other job", str(defaults.get("slurm_partition", "")), minutes, minutes, attempts))
    return asks


def partition_exists(partition: str, partitions: Mapping[str, Any], rules: Sequence[str]) -> Result:
    """A partition the profile names exists."""
    check = f"slurm partition {partition or '<default>'} exists ({', '.join(rules)})"
    if not partition:
        return skipped(check, "the profile names no slurm_partition: jobs go to the cluster's default")
    if partition not in partitions:
        return failed(check, f"no such partition (the cluster has: {', '.join(sorted(partitions)) or 'none'})",
                      "set slurm_partition in the profile's site block to one of them")
    return ok(check)


def partition_maxtime(partition: str, fields: Mapping[str, str], asks: Sequence[JobAsk]) -> Result:
    """The partition's MaxTime covers the longest runtime its jobs ask, at every retry."""
    longest = max(asks, key=lambda a: a.minutes_last)
    limit = parse_slurm_minutes(fields.get("MaxTime", "UNLIMITED"))
    check = (f"slurm partition {partition} MaxTime {fields.get('MaxTime', 'UNLIMITED')} >= "
             f"{longest.minutes_last} min ({longest.rule}"
             + (f", attempt {longest.attempts}" if longest.minutes_last != longest.minutes else "") + ")")
    if limit is None or longest.minutes_last <= limit:
        return ok(check)
    first = max(asks, key=lambda a: a.minutes)
    if first.minutes > limit:
        why = f"{first.rule} jobs ask up to {first.minutes} min at their first attempt, MaxTime is {limit:.0f} min"
    else:
        why = (f"{longest.rule} jobs ask up to {longest.minutes} min, {longest.minutes_last} min at retry attempt "
               f"{longest.attempts} (runtime grows with each attempt), MaxTime is {limit:.0f} min")
    return failed(check, why,
                  "use a partition with a longer MaxTime (slurm_partition), lower `retries`, or split the grid")


_GPU_GRES = re.compile(r"gpu(?::([A-Za-z0-9_.-]+))?:(\d+)")


def gres_gpus(gres: Iterable[str]) -> list[tuple[str | None, int]]:
    """(type, count) of every ``gpu`` GRES of node groups (``gpu:h100:8(S:0-1)``, ``gpu:4``)."""
    found = []
    for entry in gres:
        for item in re.split(r",(?![^(]*\))", entry):
            match = _GPU_GRES.match(item.strip())
            if match:
                found.append((match.group(1), int(match.group(2))))
    return found


def partition_gpus(partition: str, gres: Sequence[str], gpus: int, gpu_model: str | None) -> Result:
    """Some node of the partition has ``gpus`` GPUs of type ``gpu_model`` (any type when unset)."""
    kind = f"{gpu_model}:" if gpu_model else ""
    check = f"slurm partition {partition} GRES has gpu:{kind}{gpus} per node"
    found = gres_gpus(gres)
    fits = [(t, n) for t, n in found if n >= gpus and (gpu_model is None or (t or "").lower() == gpu_model.lower())]
    if fits:
        return ok(check)
    have = ", ".join(f"gpu:{t + ':' if t else ''}{n}" for t, n in found) or "no gpu GRES"
    why = f"its nodes have {have}; engine jobs ask {gpus} GPU(s)" + (f" of type {gpu_model}" if gpu_model else "")
    return failed(check, why,
                  "set gpu_model (or delete it for untyped GRES) and slurm_partition of the engine rules in the "
                  "profile to a GPU partition that has them")


def slurm_checks(site: Site) -> list[Result]:
    """With ``executor: slurm``: SLURM answers; per partition: exists, MaxTime, GPUs."""
    if site.profile.get("executor") != "slurm":
        return [skipped("slurm", f"{site.profile_dir or 'no profile'} does not use executor: slurm")]
    results = [slurm_reachable()]
    if results[0].failed:
        return results
    partitions = slurm_partitions()
    if isinstance(partitions, str):
        return results + [failed("slurm: scontrol show partition", partitions, "check the SLURM client setup")]
    if site.config is None:
        return results
    asks = job_asks(site.config, site.plan, site.profile)
    by_partition: dict[str, list[JobAsk]] = {}
    for ask in asks:
        by_partition.setdefault(ask.partition, []).append(ask)
    for partition, its in by_partition.items():
        exists = partition_exists(partition, partitions, [a.rule for a in its])
        results.append(exists)
        if exists.status != OK:
            continue
        results.append(partition_maxtime(partition, partitions[partition], its))
        gpu_asks = [a for a in its if a.gpus]
        if gpu_asks:
            gres = slurm_gres(partition)
            if isinstance(gres, str):
                results.append(failed(f"slurm partition {partition} GRES", gres, "check the SLURM client setup"))
                continue
            models = {a.gpu_model for a in gpu_asks}
            for model in sorted(models, key=str):
                need = max(a.gpus for a in gpu_asks if a.gpu_model == model)
                results.append(partition_gpus(partition, gres, need, model))
    # QOS and association limits (sacctmgr)
    return results + site_checks(site.config, site.plan, site.profile, site.profile_dir, partitions)
