"""The Python training API: ``mcgpo.load_config`` and ``mcgpo.train``, the config objects and
the loop the CLI uses (a smoke run of the micro model, seconds)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import mcgpo
from mcgpo.training.checkpoint import latest_checkpoint, load_checkpoint
from mcgpo.training.config import ConfigError, RunConfig


def test_import_mcgpo_stays_light_and_exports_the_training_api():
    code = "import sys, mcgpo; print('torch' in sys.modules, sorted(mcgpo.__all__))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded, names = out.stdout.split(" ", 1)
    assert loaded == "False"
    for name in ("train", "load_config", "RunConfig", "ConfigError"):
        assert repr(name) in names
    assert mcgpo.RunConfig is RunConfig and mcgpo.ConfigError is ConfigError


def test_load_config_is_the_command_lines_resolution():
    from mcgpo.cli import resolve

    cfg = mcgpo.load_config("household-smoke", **{"train.updates": 3, "algo.pairs.kappa": "2"})
    assert cfg == resolve(
        "train", ["--preset", "household-smoke", "--train.updates", "3", "--algo.pairs.kappa", "2"]
    )
    assert mcgpo.load_config() == RunConfig()
    with pytest.raises(ConfigError, match=r"unknown key 'train.lrr' \(did you mean 'train.lr'\?\)"):
        mcgpo.load_config(**{"train.lrr": 1})
    with pytest.raises(ConfigError, match=r"train\.lr must be > 0"):
        mcgpo.load_config(**{"train.lr": -1})


def test_train_runs_and_resumes_from_python(micro_model, tmp_path):
    out = tmp_path / "run"
    overrides = {"model": str(micro_model), "out": str(out), "train.updates": 1, "threads": 1}
    table = mcgpo.train(mcgpo.load_config("household-smoke", **overrides))
    assert table.header == ["metric", "before (update 0)", "after (update 1)"]
    assert (out / "model" / "config.json").is_file()
    # go on from the run folder's config.toml
    more = mcgpo.load_config(str(out / "config.toml"), resume=True, **{"train.updates": 2})
    mcgpo.train(more)
    assert load_checkpoint(latest_checkpoint(out)).update == 2
    lines = (out / "config.toml").read_text().splitlines()
    assert lines[:2] == ["# resolved mcgpo config", "# resumed: mcgpo.train (Python)"]


def test_a_hub_id_given_to_the_api_is_one_line(tmp_path):
    cfg = mcgpo.load_config(
        "household-smoke", model="Qwen/Qwen2.5-1.5B-Instruct", out=str(tmp_path / "r")
    )
    with pytest.raises(ConfigError, match=r"pass a local folder: .*\(no download here\)$"):
        mcgpo.train(cfg)
