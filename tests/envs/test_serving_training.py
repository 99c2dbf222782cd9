"""`mcgpo train --env.name remote`: a training run on a served environment is the run on the
local one (the same rollouts, so the same weights), and a bad server is one line, exit 2."""

from __future__ import annotations

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

from mcgpo.cli import main
from mcgpo.envs.serving.launch import ServedEnv
from mcgpo.envs.workers import EnvSpec

pytestmark = [pytest.mark.serve, pytest.mark.slow]


def weights(folder):
    from safetensors.torch import load_file

    (path,) = sorted(folder.rglob("model.safetensors"))[-1:]
    return load_file(path)


def test_a_training_run_on_a_served_env_equals_the_local_run(micro_model, tmp_path, capsys):
    args = ["train", "--preset", "household-smoke", "--model", str(micro_model),
            "--train.updates", "1", "--eval.every", "0"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "local")]) == 0
    with ServedEnv(EnvSpec("household"), "household", max_sessions=16) as url:
        remote = ["--env.name", "remote", "--env.url", url, "--env.remote_name", "household"]
        assert main([*args, *remote, "--out", str(tmp_path / "remote")]) == 0
    here, there = weights(tmp_path / "local"), weights(tmp_path / "remote")
    assert here.keys() == there.keys() and all((here[k] == there[k]).all() for k in here)
    assert (tmp_path / "remote" / "config.toml").read_text().count('remote_name = "household"')


def test_an_unreachable_server_is_one_line_and_exit_2(micro_model, tmp_path, capsys):
    code = main(["train", "--preset", "household-smoke", "--model", str(micro_model),
                 "--out", str(tmp_path / "r"), "--env.name", "remote",
                 "--env.url", "http://127.0.0.1:9", "--env.remote_name", "household",
                 "--env.retries", "0"])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("mcgpo train: error: env 'remote': remote env: http://127.0.0.1:9")
