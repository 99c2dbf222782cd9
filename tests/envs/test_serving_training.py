"""`mcgpo train --env.name remote`: a training run on a served environment is the run on the
local one (the same rollouts, so the same weights; with a saved model and with the default
tiny one), a bad server is one line, exit 2, and a server that dies mid-run is a warning per
update, then a one-line stop (exit 1) that --resume goes on from once the server is back."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

from mcgpo.cli import main
from mcgpo.envs.serving.launch import ServedEnv
from mcgpo.envs.workers import EnvSpec

pytestmark = [pytest.mark.serve, pytest.mark.slow]
WAIT = 120.0  # seconds: wide margins for a busy 2-core machine (never a speed assertion)


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


def test_with_the_default_tiny_model_a_run_on_a_served_env_equals_the_local_run(tmp_path):
    # the tiny model's tokenizer and weights come from a corpus of the environment's episodes:
    # played through the server, seeded by the served environment's name, they are the same
    args = ["train", "--preset", "household-smoke", "--train.updates", "1", "--eval.every", "0",
            "--corpus-episodes", "8"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "local")]) == 0
    with ServedEnv(EnvSpec("household"), "household", max_sessions=16) as url:
        remote = ["--env.name", "remote", "--env.url", url, "--env.remote_name", "household"]
        assert main([*args, *remote, "--out", str(tmp_path / "remote")]) == 0
    here, there = weights(tmp_path / "local"), weights(tmp_path / "remote")
    assert here.keys() == there.keys() and all((here[k] == there[k]).all() for k in here)
    vocab = [
        (tmp_path / run / "model" / "tokenizer.json").read_text() for run in ("local", "remote")
    ]
    assert vocab[0] == vocab[1]


def test_an_unreachable_server_is_one_line_and_exit_2(micro_model, tmp_path, capsys):
    code = main(["train", "--preset", "household-smoke", "--model", str(micro_model),
                 "--out", str(tmp_path / "r"), "--env.name", "remote",
                 "--env.url", "http://127.0.0.1:9", "--env.remote_name", "household",
                 "--env.retries", "0"])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("mcgpo train: error: env 'remote': remote env: http://127.0.0.1:9")


def serve_on(port: int) -> subprocess.Popen:
    """`mcgpo env serve --env household --port PORT` in a process, once it listens."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "mcgpo", "env", "serve", "--env", "household", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    line = proc.stdout.readline()
    if not line.startswith("serving household on http://127.0.0.1:"):
        proc.kill()
        raise AssertionError(f"server did not start: {line!r} {proc.stderr.read()}")
    return proc


def stopped(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(WAIT)
    proc.stdout.close()
    proc.stderr.close()


def test_a_server_killed_mid_rollout_warns_each_update_stops_the_run_and_resume_completes_it(
    micro_model, tmp_path, capsys, monkeypatch
):
    from mcgpo.envs.serving.client import RemoteEnv
    from mcgpo.training import trainer
    from mcgpo.training.checkpoint import latest_checkpoint
    from mcgpo.training.metrics import read_metrics

    with socket.socket() as probe:  # a free port the restarted server binds again
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = serve_on(port)
    armed, steps = {"update": 0}, {"n": 0}
    real_collect, real_step = trainer._collect, RemoteEnv.step

    def collect(run, update):
        armed["update"] = update
        return real_collect(run, update)

    def step(self, action):  # update 2's fifth step first kills the server: mid-rollout
        if armed["update"] == 2:
            steps["n"] += 1
            if steps["n"] == 5 and proc.poll() is None:
                proc.kill()
                proc.wait(WAIT)
        return real_step(self, action)

    monkeypatch.setattr(trainer, "_collect", collect)
    monkeypatch.setattr(RemoteEnv, "step", step)
    out = tmp_path / "run"
    args = ["train", "--preset", "household-smoke", "--model", str(micro_model),
            "--train.updates", "6", "--env.name", "remote",
            "--env.url", f"http://127.0.0.1:{port}", "--env.remote_name", "household",
            "--env.retries", "0", "--out", str(out)]  # fmt: skip
    try:
        assert main(args) == 1
        err = capsys.readouterr().err.strip().splitlines()
        warned = [line for line in err if line.startswith("mcgpo train: warning: update ")]
        assert [line.split()[4] for line in warned] == ["2:", "3:", "4:"]
        assert all("all 8 trajectories hit an environment error" in w for w in warned)
        assert all("EnvServerLost" in w for w in warned)  # the cause of the first error
        evals = [line for line in err if line.startswith("mcgpo train: warning: evaluation")]
        assert [line.split()[6] for line in evals] == ["2:", "3:"]
        assert all("2 of 2 episodes hit an environment error" in e for e in evals)
        assert err[-1].startswith("mcgpo train: error: updates 2-4: every trajectory hit an ")
        assert "(3 updates in a row, train.max_failed_updates)" in err[-1]
        assert err[-1].endswith("the last checkpoint is update 1: rerun with --resume once "
                                "the environment is back")  # fmt: skip
        assert latest_checkpoint(out).name.endswith("1")
        failed = [r for r in read_metrics(out / "metrics.jsonl") if "rollout/trajectories" in r]
        assert [r["rollout/errored_trajectories"] for r in failed] == [0, 8, 8, 8]
        proc = serve_on(port)  # the environment is back
        monkeypatch.setattr(RemoteEnv, "step", real_step)
        assert main([*args, "--resume"]) == 0
        err = capsys.readouterr().err
        assert "environment error" not in err and "updates in a row" not in err
        records = read_metrics(out / "metrics.jsonl")
        done = [r for r in records if "rollout/trajectories" in r]
        assert [r["update"] for r in done] == [1, 2, 3, 4, 5, 6]
        assert [r["rollout/errored_trajectories"] for r in done] == [0] * 6
        assert records[-1]["eval/errored"] == 0 and records[-1]["eval/episodes"] == 2
    finally:
        stopped(proc)
