#!/usr/bin/env bash
# The test command: set up .venv (with the alfworld, textworld-express and webshop extras, whose
# tests run too; MCGPO_EXTRAS="" skips them), lint, check the import layers (the
# import-linter contracts in pyproject.toml: layers run one way, no cycles), run the whole
# test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
MCGPO_EXTRAS=${MCGPO_EXTRAS-alfworld,twx,webshop} bash scripts/setup.sh
. .venv/bin/activate
ruff check src tests benchmarks
ruff format --check src tests benchmarks
lint-imports --no-cache --no-logo
python -m pytest -q -n 2 "$@"
