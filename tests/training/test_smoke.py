"""CPU smoke runs of the real CLI (``mcgpo.cli.main`` in-process) with a micro policy.

Two updates of every algorithm: exit code 0, every logged loss finite, every trainable
parameter changed (weight decay off, so a change comes from a gradient). Then the parts of
a run a user inspects: the run folder, ``--save-rollouts`` Parquet files, errored
trajectories left out of learning, ``mcgpo sft`` and ``mcgpo eval``.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from mcgpo.cli import main
from mcgpo.envs import ENVIRONMENTS, make_env
from mcgpo.training.algorithms import ALGORITHMS
from mcgpo.training.metrics import read_metrics

pytestmark = pytest.mark.slow  # about 1-2 s per run after the first (imports)


def weights(folder) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_two_updates_of_every_algorithm(micro_model, smoke_args, tmp_path, capsys, algo):
    out = tmp_path / algo
    assert main(smoke_args(out, "--algo.name", algo)) == 0
    records = read_metrics(out / "metrics.jsonl")
    updates = [r for r in records if "loss/task" in r]
    assert [r["update"] for r in updates] == [1, 2]
    for r in updates:
        for key, value in r.items():
            if key.startswith("loss/"):
                assert isinstance(value, float) and math.isfinite(value), (key, value)
        assert r["update/optimizer_steps"] == 1.0
    if ALGORITHMS[algo].pairs:
        assert all("pairs/preferences" in r for r in updates)
    before, after = weights(micro_model), weights(out / "model")
    assert before.keys() == after.keys()
    unchanged = [k for k in before if torch.equal(before[k], after[k])]
    assert unchanged == []
    # the final table: evaluation before training and after the last update
    text = capsys.readouterr().out
    assert "before (update 0)" in text and "after (update 2)" in text


def test_run_folder_holds_config_metrics_checkpoints_and_model(smoke_args, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(smoke_args(out, "--tensorboard", "--save-rollouts")) == 0
    config = (out / "config.toml").read_text()
    assert config.startswith("# mcgpo train --preset household-smoke")
    assert "[algo.pairs]" in config and "omega = " in config  # resolved options written out
    assert (out / "checkpoints" / "latest").read_text().strip() == "update-000002"
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert (out / "model" / "config.json").is_file()
    # a second run into the same folder would mix two runs: refused
    assert main(smoke_args(out)) == 2
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    assert "mcgpo update 2" in capsys.readouterr().out


def test_saved_rollouts_carry_advantages_and_pair_columns(smoke_args, tmp_path):
    out = tmp_path / "run"
    assert main(smoke_args(out, "--save-rollouts")) == 0
    files = sorted((out / "rollouts").glob("*.parquet"))
    assert [f.name for f in files] == ["update-000001.parquet", "update-000002.parquet"]
    df = pd.read_parquet(files[0])
    for column in ("group", "slot", "turn", "action", "state", "progress", "advantage"):
        assert column in df.columns
    for column in ("pair", "pair_role", "pair_partner", "pair_weight", "pair_level", "response"):
        assert column in df.columns
    assert len(df) == 2 * 4 * 3  # 2 tasks x 4 siblings x 3 turns (the smoke preset)
    assert df["learnable"].all() and df["advantage"].notna().all()
    # pair columns are consistent: partners point at each other with opposite roles
    paired = df[df["pair"] >= 0]
    for i, row in paired.iterrows():
        other = df.loc[row["pair_partner"]]
        assert other["pair_partner"] == i and other["pair"] == row["pair"]
        assert {row["pair_role"], other["pair_role"]} == {"plus", "minus"}


class FlakyEnv:
    """The household environment, except that odd tasks raise on their second step."""

    def __init__(self):
        self.inner = make_env("household")
        self.max_turns = self.inner.max_turns
        self.task = 0
        self.turn = 0

    def reset(self, seed=0, split="train"):
        self.task, self.turn = seed, 0
        return self.inner.reset(seed=seed, split=split)

    def step(self, action):
        self.turn += 1
        if self.task % 2 == 1 and self.turn == 2:
            raise RuntimeError("simulated simulator crash")
        return self.inner.step(action)

    def expert_action(self):
        return self.inner.expert_action()


def test_errored_trajectories_are_excluded_from_learning(smoke_args, tmp_path, monkeypatch):
    monkeypatch.setitem(ENVIRONMENTS, "flaky", lambda **_: FlakyEnv())
    out = tmp_path / "run"
    args = smoke_args(out, "--env.name", "flaky", "--save-rollouts")
    assert main([*args, "--train.updates", "1", "--algo.name", "grpo"]) == 0
    df = pd.read_parquet(out / "rollouts" / "update-000001.parquet")
    # task numbers start at seed * 1e6 = 0: tasks 0 and 1, so the second group errors
    bad = df["errored"].to_numpy()
    assert bad.any() and not bad.all()
    assert (df["group"][bad] == 1).all()
    assert not df["learnable"][bad].any() and df["advantage"][bad].isna().all()
    record = next(r for r in read_metrics(out / "metrics.jsonl") if "update/rows" in r)
    assert record["update/rows"] == float((~bad).sum())
    assert record["rollout/errored_trajectories"] == 4.0


def test_sft_then_eval(micro_model, tmp_path, capsys):
    sft = tmp_path / "sft"
    args = ["sft", "--preset", "household-smoke", "--model", str(micro_model), "--out", str(sft)]
    assert main([*args, "--sft.demos", "3"]) == 0
    summary = json.loads((sft / "sft.json").read_text())
    # expert episodes are cut at the preset's 3 turns: 3 episodes give 9 turns at most
    turns = summary["demos"]["turns"]
    assert summary["demos"]["episodes"] == 3 and 3 <= turns <= 9
    assert summary["steps"] == -(-turns // 8)  # 1 epoch, 8 turns per step (the preset)
    losses = [r["sft/loss"] for r in read_metrics(sft / "metrics.jsonl") if "sft/loss" in r]
    assert len(losses) == summary["steps"] and np.all(np.isfinite(losses))
    assert "before SFT" in capsys.readouterr().out
    assert main(["report", str(sft)]) == 0
    header = capsys.readouterr().out.splitlines()[1]
    assert header.split() == ["metric", "untrained", "after", "SFT"]
    out = tmp_path / "eval"
    args = ["eval", "--preset", "household-smoke", "--model", str(sft / "model"), "--out", str(out)]
    assert main(args) == 0
    stats = json.loads((out / "eval.json").read_text())
    assert stats["eval/episodes"] == 2.0 and 0.0 <= stats["eval/success"] <= 1.0
    # every evaluation of a seed uses the same tasks and sampling stream: the saved policy
    # evaluates exactly as it did at the end of the warm start
    assert stats["processes"] == 1
    assert {k: v for k, v in stats.items() if k not in ("command", "processes")} == summary["after"]
    assert "evaluation of" in capsys.readouterr().out
    # eval.temperature 0 is greedy: the arg-max action whatever the sampling seed
    greedy = []
    for seed in ("0", "7"):
        out = tmp_path / f"greedy-{seed}"
        assert main([*args[:-1], str(out), "--eval.temperature", "0", "--seed", seed]) == 0
        greedy.append(json.loads((out / "eval.json").read_text()))
    a, b = ({k: v for k, v in g.items() if k not in ("command", "eval/time")} for g in greedy)
    assert a == b and a["eval/episodes"] == 2.0


def test_mcgpo_without_the_pair_term_is_graphgpo(micro_model, smoke_args, tmp_path):
    """MCGPO = GraphGPO + lambda * L_pair: with lambda = 0 a whole run (rollouts, updates,
    evaluations, final weights) is GraphGPO's, bit for bit. The bench shows the same thing
    on household-quick: an MCGPO update that found no preference leaves both runs equal."""
    runs = {}
    for name, extra in (("graphgpo", ()), ("mcgpo", ("--algo.lambda_pair", "0"))):
        out = tmp_path / name
        flags = ("--algo.name", name, "--deterministic", "true", *extra)
        assert main(smoke_args(out, *flags)) == 0
        runs[name] = out
    g, m = (read_metrics(runs[k] / "metrics.jsonl") for k in ("graphgpo", "mcgpo"))
    keys = ("rollout/success_rate", "rollout/rows", "loss/task", "eval/success")
    assert [[r.get(k) for k in keys] for r in g] == [[r.get(k) for k in keys] for r in m]
    wg, wm = weights(runs["graphgpo"] / "model"), weights(runs["mcgpo"] / "model")
    assert all(torch.equal(wg[k], wm[k]) for k in wg)
