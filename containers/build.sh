#!/usr/bin/env bash
# Build the rendered Apptainer definitions into containers/sif/<name>.sif (apptainer >= 1.0).
# The .def files come from containers/images.yaml: `sdbench containers render`, then
# `sdbench containers check`.
#   bash containers/build.sh                      # every definition
#   bash containers/build.sh sdbench-analysis ... # some, by name
#   bash containers/build.sh --check-space [NAME...]  # only the space check below, then exit
#
# As a cluster user (not root) it builds with --fakeroot. A vLLM base image is ~10 GB
# compressed: its layers are cached and the image assembled on node-local disk, never in $HOME.
# Environment:
#   APPTAINER_BUILD        the build command (default: `apptainer build`, plus --fakeroot when
#                          not root); a site's own, e.g. "sudo apptainer build"
#   SDBENCH_BUILD_SCRATCH  where the two directories below go (default: $TMPDIR, else /tmp)
#   APPTAINER_CACHEDIR     pulled layers (default: $SDBENCH_BUILD_SCRATCH/apptainer-$USER/cache)
#   APPTAINER_TMPDIR       the image being assembled (default: .../apptainer-$USER/tmp)
#   SDBENCH_BUILD_FREE_KB_OVERRIDE  TEST HOOK: the free KB every filesystem reports (tests
#                          check the arithmetic without a full disk); unset on a real build
#
# Before any build it checks the space, per filesystem: APPTAINER_TMPDIR, APPTAINER_CACHEDIR and
# sif/ often share one, so what each needs is summed where they do (see SIZES_GB).
set -euo pipefail
cd "$(dirname "$0")" # the %files paths (../src, ...) are relative to this directory

fail() { echo "build.sh: $*" >&2; exit 1; }

check_only=0
if [ "${1:-}" = --check-space ]; then check_only=1; shift; fi
if [ "$#" -eq 0 ]; then set -- *.def; fi
names=()
for name in "$@"; do
    name="${name%.def}"
    [ -f "${name}.def" ] ||
        fail "no containers/${name}.def; \`sdbench containers render\` writes one per image of containers/images.yaml"
    names+=("$name")
done

scratch="${SDBENCH_BUILD_SCRATCH:-${TMPDIR:-/tmp}}/apptainer-$(id -un)"
export APPTAINER_CACHEDIR="${APPTAINER_CACHEDIR:-$scratch/cache}"
export APPTAINER_TMPDIR="${APPTAINER_TMPDIR:-$scratch/tmp}"

# GB an image needs, by the kind its .def labels (org.sdbench.image.kind): "tmp cache sif".
# tmp: the unpacked image plus its squashfs (an unpacked vLLM image is up to 25 GB); apptainer
# removes it after each build, so the largest image counts. cache: its pulled layers (a vLLM
# base is ~10 GB compressed), kept, so they add up; sif: the image itself, added up too.
# An unknown kind counts as a vLLM image.
declare -A SIZES_GB=([engine]="25 10 10" [cpu-engine]="10 2 4" [analysis]="5 1 2")
tmp_gb=0 cache_gb=0 sif_gb=0
for name in "${names[@]}"; do
    kind="$(awk '$1 == "org.sdbench.image.kind" {print $2; exit}' "${name}.def")"
    read -r t c s <<<"${SIZES_GB[${kind:-engine}]:-${SIZES_GB[engine]}}"
    if [ "$t" -gt "$tmp_gb" ]; then tmp_gb="$t"; fi
    cache_gb=$((cache_gb + c))
    sif_gb=$((sif_gb + s))
done

override="${SDBENCH_BUILD_FREE_KB_OVERRIDE:-}"
[[ -z "$override" || "$override" =~ ^[0-9]+$ ]] ||
    fail "SDBENCH_BUILD_FREE_KB_OVERRIDE=$override: expected a number of KB (a test hook; unset it)"
declare -A fs_need=() fs_free=() fs_what=()
fs_order=()
for entry in "APPTAINER_TMPDIR:$APPTAINER_TMPDIR:$tmp_gb" "APPTAINER_CACHEDIR:$APPTAINER_CACHEDIR:$cache_gb" \
    "sif/:$(pwd)/sif:$sif_gb"; do
    label="${entry%%:*}" rest="${entry#*:}"
    dir="${rest%:*}" gb="${rest##*:}"
    at="$dir" # made only after the check: the nearest existing directory tells the filesystem
    while [ ! -e "$at" ] && [ "$at" != / ]; do at="$(dirname "$at")"; done
    # df -P: one line per filesystem; the mount point is everything after the 5th field.
    read -r free_kb mount < <(df -Pk "$at" |
        awk 'NR == 2 {free = $4; $1 = $2 = $3 = $4 = $5 = ""; sub(/^ +/, ""); print free, $0}')
    [ -n "${mount:-}" ] || fail "df cannot read the filesystem of $label $dir"
    if [ -z "${fs_need[$mount]+set}" ]; then fs_order+=("$mount"); fs_need[$mount]=0; fi
    fs_free[$mount]="${override:-$free_kb}"
    fs_need[$mount]=$((fs_need[$mount] + gb))
    fs_what[$mount]+="${fs_what[$mount]:+, }$label $dir $gb GB"
done
images="${#names[@]} image(s): ${names[*]}"
for mount in "${fs_order[@]}"; do
    free_gb=$((fs_free[$mount] / 1024 / 1024))
    verdict="filesystem $mount has $free_gb GB free, building $images needs ${fs_need[$mount]} GB there"
    verdict+=" (${fs_what[$mount]})"
    [ "${fs_free[$mount]}" -ge $((fs_need[$mount] * 1024 * 1024)) ] ||
        fail "$verdict; free space or set APPTAINER_TMPDIR / APPTAINER_CACHEDIR (or SDBENCH_BUILD_SCRATCH)" \
            "to a larger node-local disk"
    if [ "$check_only" -eq 1 ]; then echo "build.sh: $verdict"; fi
done
if [ "$check_only" -eq 1 ]; then exit 0; fi
for var in APPTAINER_CACHEDIR APPTAINER_TMPDIR; do
    mkdir -p "${!var}" 2>/dev/null ||
        fail "cannot create $var=${!var}; set $var (or SDBENCH_BUILD_SCRATCH) to a writable node-local directory"
done
mkdir -p sif 2>/dev/null || fail "cannot create $(pwd)/sif, where the images go"

if [ -n "${APPTAINER_BUILD:-}" ]; then
    read -ra build <<<"$APPTAINER_BUILD"
elif [ "$(id -u)" -eq 0 ]; then
    build=(apptainer build)
else
    build=(apptainer build --fakeroot)
fi

for name in "${names[@]}"; do
    "${build[@]}" --force "sif/${name}.sif" "${name}.def"
done
