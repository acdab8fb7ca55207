#!/usr/bin/env bash
# The paper grid rehearsed through a local single-node SLURM, every job's memory and time checked.
#
#   scripts/rehearse-paper-grid.sh [RUN_DIR] [SNAKEMAKE_ARGS...]
#   nohup scripts/rehearse-paper-grid.sh ../rehearsals/paper-1 > /dev/null 2>&1 &   # in the background
#
# Starts the local SLURM of tests/support/slurm_cluster.py with the GPU node profiles/slurm's site
# block describes (8 typed GPUs, 192 CPUs, 2 TB declared; partitions gpu and cpu, MaxTime 2,880
# min) and a watcher of every job's memory and time (tests/support/slurm_usage.py), runs
#   snakemake --configfile config/paper.yaml RUN_DIR/rehearsal-overlay.yaml \
#       --profile profiles/slurm --workflow-profile .test/profiles/slurm-rehearsal
# in RUN_DIR (engine jobs in rehearsal mode: the overlay profile's `engine_mode=rehearsal`; the
# published traces of gsm8k and instructcoder read from TRACES_DIR), stops the cluster and checks
# every job with `sdbench bench job-usage` and every figure's rehearsal mark with `sdbench rehearsal
# marks`. Everything lands in RUN_DIR: snakemake.log, cluster.log, usage/ (one record per job),
# job-usage.md and .parquet (the check), marks.md, timeline.txt
# (`sdbench bench timeline`: where the wall time went, local rules included), results/, logs/
# and run.md (what ran, when, how it ended). Exit status: 0 when Snakemake finished, no job
# failed or went over its asks and every figure's mark agrees with its data.
#
# Environment: CONFIGFILES (default config/paper.yaml; several, space-separated: the rehearsal
# overlay goes right after the first, so later ones override it), PROFILE (profiles/slurm),
# WORKFLOW_PROFILE (.test/profiles/slurm-rehearsal), TRACES_DIR (the published traces; default
# where the workflow's fetch puts them, resources/published-traces/llama3.1-8B: fetch them there
# once with `.venv/bin/sdbench fetch published-traces --dataset gsm8k --output DIR/combined_gsm8k.jsonl`
# (and instructcoder), or point TRACES_DIR at a local copy).
# Needs root the first time (the Debian slurm and munge packages are installed when missing).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RUN=${1:-$REPO/../rehearsals/paper-$(date -u +%Y-%m-%dT%H%MZ)}
shift $(( $# > 0 ? 1 : 0 ))
read -r -a CONFIGS <<< "${CONFIGFILES:-config/paper.yaml}"
PROFILE=${PROFILE:-profiles/slurm}
WORKFLOW_PROFILE=${WORKFLOW_PROFILE:-.test/profiles/slurm-rehearsal}
TRACES_DIR=${TRACES_DIR:-$REPO/resources/published-traces/llama3.1-8B}
PY=$REPO/.venv/bin/python

for f in combined_gsm8k.jsonl combined_instructcoder.jsonl; do
    [[ -f $TRACES_DIR/$f ]] || { echo "error: $TRACES_DIR/$f missing: fetch it (.venv/bin/sdbench fetch published-traces --dataset <name> --output <file>) or set TRACES_DIR" >&2; exit 2; }
done
[[ -x $PY ]] || { echo "error: $PY missing: run scripts/bootstrap.sh" >&2; exit 2; }
mkdir -p "$RUN"
RUN=$(cd "$RUN" && pwd)
TRACES_DIR=$(cd "$TRACES_DIR" && pwd)
cd "$REPO"
export PYTHONPATH=$REPO/src PATH=$REPO/.venv/bin:$PATH

# Only the published traces that exist offline (sharegpt and cnn are held out).
cat > "$RUN/rehearsal-overlay.yaml" <<EOF
published_traces:
  datasets: [gsm8k, instructcoder]
  local_dir: $TRACES_DIR
EOF

started=$(date -u +%FT%TZ)
t0=$(date +%s)
# A run directory used before holds the previous cluster's env file, whose slurm.conf is gone:
# waiting for it would return at once and every sbatch would fail.
rm -f "$RUN/slurm.env"
"$PY" tests/support/slurm_cluster.py hold --profile "$PROFILE" --env-file "$RUN/slurm.env" \
    --usage-dir "$RUN/usage" > "$RUN/cluster.log" 2>&1 &
HOLD=$!
stop_cluster() {
    if kill -0 "$HOLD" 2>/dev/null; then
        kill -TERM "$HOLD" && wait "$HOLD" || true
    fi
}
trap stop_cluster EXIT
for _ in $(seq 1 600); do
    [[ -f $RUN/slurm.env ]] && break
    kill -0 "$HOLD" 2>/dev/null || { echo "error: the cluster did not start: $RUN/cluster.log" >&2; tail -20 "$RUN/cluster.log" >&2; exit 1; }
    sleep 0.5
done
[[ -f $RUN/slurm.env ]] || { echo "error: the cluster did not start in 300 s: $RUN/cluster.log" >&2; exit 1; }
# shellcheck disable=SC1091
source "$RUN/slurm.env"

smk=0
snakemake --snakefile "$REPO/Snakefile" --directory "$RUN" \
    --configfile "${CONFIGS[0]}" "$RUN/rehearsal-overlay.yaml" "${CONFIGS[@]:1}" \
    --profile "$PROFILE" --workflow-profile "$WORKFLOW_PROFILE" "$@" > "$RUN/snakemake.log" 2>&1 || smk=$?
wall=$(( $(date +%s) - t0 ))
stop_cluster  # writes the last usage records
trap - EXIT

check=0
sdbench bench job-usage --usage-dir "$RUN/usage" --output "$RUN/job-usage.parquet" \
    --markdown "$RUN/job-usage.md" > /dev/null 2> "$RUN/job-usage.err" || check=$?
# Every figure and Markdown table marked exactly when drawn from rehearsal data (a grid may leave
# index items out: listed, not required).
marks=0
sdbench rehearsal marks --paper-dir "$RUN/results/paper" --expect --markdown "$RUN/marks.md" > /dev/null \
    2> "$RUN/marks.err" || marks=$?
log=$(ls -t "$RUN"/.snakemake/log/*.snakemake.log 2>/dev/null | head -1 || true)
[[ -n $log ]] && sdbench bench timeline --log "$log" > "$RUN/timeline.txt" 2>&1 || true

{
    echo "# Rehearsal: ${CONFIGS[*]} through the local SLURM"
    echo
    echo "- started $started, wall $(( wall / 3600 ))h $(( wall % 3600 / 60 ))min $(( wall % 60 ))s on $(hostname -s) ($(nproc) cores, $(free -g | awk '/^Mem:/ {print $2}') GiB)"
    echo "- commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . 2>/dev/null || echo ' (with local changes)')"
    echo "- snakemake --configfile ${CONFIGS[0]} rehearsal-overlay.yaml ${CONFIGS[*]:1} --profile $PROFILE --workflow-profile $WORKFLOW_PROFILE $*"
    echo "- snakemake exit status $smk ($(grep -c 'has been submitted with SLURM jobid' "$RUN/snakemake.log" || true) SLURM jobs; last line: $(tail -1 "$RUN/snakemake.log"))"
    echo "- job check exit status $check$( [[ -s $RUN/job-usage.err ]] && echo ": $(cat "$RUN/job-usage.err")")"
    echo "- marks check exit status $marks$( [[ -s $RUN/marks.err ]] && echo ": $(cat "$RUN/marks.err")")"
    echo
    cat "$RUN/job-usage.md" 2>/dev/null || echo "(no job records)"
    echo
    cat "$RUN/marks.md" 2>/dev/null || echo "(no results/paper)"
    # A failure must read from run.md alone (CI keeps nothing else): the end of each failed job's
    # logs, as Snakemake's "Error in rule" block names them (its rule log, then SLURM's).
    "$PY" - "$RUN" <<'PY'
import re, sys
from pathlib import Path
run = Path(sys.argv[1])
text = (run / "snakemake.log").read_text(errors="replace") if (run / "snakemake.log").exists() else ""
blocks = re.findall(r"^Error in rule (\S+):\n(.*?)(?=^\S|\Z)", text, re.M | re.S)
for rule, body in blocks:
    print(f"\n## Error in rule {rule}\n")
    print("\n".join("    " + line.strip() for line in body.strip().splitlines()[:4]))
    match = re.search(r"^\s*log: (.*?)(?: \(check log file\(s\) for error details\))?$", body, re.M)
    for name in (match.group(1).split(", ") if match else []):
        path = Path(name) if Path(name).is_absolute() else run / name
        tail = path.read_text(errors="replace").splitlines()[-40:] if path.is_file() else ["(missing)"]
        print(f"\nThe end of {name}:\n")
        print("\n".join("    " + line for line in tail))
PY
} > "$RUN/run.md"
echo "rehearsal: $RUN/run.md (snakemake $smk, check $check, marks $marks)"
(( smk == 0 && check == 0 && marks == 0 ))
