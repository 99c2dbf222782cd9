"""GraphGPO and MCGPO take the same optimiser steps (issue 13, item 1).

MCGPO = GraphGPO + lambda_pair * L_pair, with GraphGPO's advantages. With a pair weight
too small to matter (1e-9) an MCGPO update must therefore land where GraphGPO's lands: the
same rows in every optimiser step, the same order, and weights equal up to float rounding
(partners may share a micro-batch in MCGPO, and the task loss's token-share weights make the
micro-batch split change only the rounding). The planner used to put every paired row into
the first mini-batch, which grouped MCGPO's rows into other optimiser steps than GraphGPO's.

Preferences need sibling rollouts that take different actions from one state and whose
outcomes differ. The ``coin`` environment below is that in its smallest form: one decision
between ``look`` and ``inventory`` (one token each for the micro policy's tokenizer);
``look`` wins on even tasks, ``inventory`` on odd ones, and the prompt does not say which. A
micro policy warm-started on its expert (``mcgpo sft``) and answering with one token says
each about half the time, so a group of 8 siblings nearly always yields preferences.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import mcgpo.training.update as update_module
from mcgpo.cli import main
from mcgpo.envs import ENVIRONMENTS, Context, Observation, StepResult
from mcgpo.policy import load_policy
from mcgpo.rollout import CollectOptions, collect
from mcgpo.training.algorithms import assign_credit, resolve_algo
from mcgpo.training.config import AlgoConfig, TrainConfig
from mcgpo.training.metrics import read_metrics
from mcgpo.training.update import PairBatch, update_policy

TASK = "Your task is to: pick the right word."
FORK = Observation(
    text="You stand at a fork.", task=TASK, admissible_actions=("look", "inventory"),
    context=Context(anchor="fork", state="fork", state_coarse="fork"),
)  # fmt: skip
END = Observation(
    text="The path ends.", task=TASK, admissible_actions=(),
    context=Context(anchor="end", state="end", state_coarse="end"),
)  # fmt: skip


class CoinEnv:
    """One decision; ``look`` wins on even tasks, ``inventory`` on odd ones."""

    max_turns = 1

    def __init__(self, **_options):
        self.task = 0

    def reset(self, seed=0, split="train"):
        self.task = seed
        return FORK

    def step(self, action):
        won = action == self.expert_action()
        info = {"won": won, "score": float(won), "action_valid": action in FORK.admissible_actions}
        return StepResult(END, 10.0 if won else 0.0, True, info)

    def expert_action(self):
        return "look" if self.task % 2 == 0 else "inventory"


COIN = (
    "--preset", "household-smoke", "--env.name", "coin", "--env.max_turns", "1",
    "--rollout.max_new_tokens", "1",
)  # fmt: skip


@pytest.fixture(scope="module")
def warm_model(micro_model, tmp_path_factory):
    """The micro policy after ``mcgpo sft`` on the coin environment (about 5 s)."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    out = tmp_path_factory.mktemp("coin") / "sft"
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(ENVIRONMENTS, "coin", CoinEnv)
        args = [
            "sft", *COIN, "--model", str(micro_model), "--out", str(out), "--sft.demos", "16",
            "--sft.epochs", "10", "--sft.batch_size", "8", "--sft.lr", "1e-2", "--sft.warmup", "0",
        ]  # fmt: skip
        assert main(args) == 0
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)
    return out / "model"


@pytest.fixture
def coin(monkeypatch):
    monkeypatch.setitem(ENVIRONMENTS, "coin", CoinEnv)


def spy_layout(monkeypatch, optimizer) -> list[list[np.ndarray]]:
    """Record the rows of every micro-batch, one list per optimiser step."""
    steps: list[list[np.ndarray]] = [[]]
    micro_step, optimizer_step = update_module._micro_step, optimizer.step

    def record_micro(model, ref_model, mb, advantages, rows, *args, **kwargs):
        steps[-1].append(np.asarray(rows).copy())
        return micro_step(model, ref_model, mb, advantages, rows, *args, **kwargs)

    def record_step(*args, **kwargs):
        steps.append([])
        return optimizer_step(*args, **kwargs)

    monkeypatch.setattr(update_module, "_micro_step", record_micro)
    monkeypatch.setattr(optimizer, "step", record_step)
    return steps


# The two arms differ in the micro-batch layout only (MCGPO keeps partners together), so the
# micro-batch gradients are summed in another order: float rounding, which AdamW amplifies
# on entries whose gradient is near its eps (1e-8), where m / (sqrt(v) + eps) is most
# sensitive to g. Measured (2-core CPU, 1 thread): in float64 the arms agree within 3e-15
# on every batch tried (seeds 0-4), so the pair term at lambda 1e-9 and the layout change
# nothing but rounding; in float32 within 1.3e-7 .. 1.7e-6 depending on the batch. On seed 4
# the largest float32 difference (1.7e-6; 11 of 36,960 entries above 1e-7) sits on an entry
# whose RMS gradient is 6e-8. Hence: the float64 run on that batch at 1e-12 (it shows the
# residual is rounding), the float32 run at 1e-6 on a batch where it holds. Which batches
# those are moves with any change of rounding: with the LM head on response positions only
# (2026-12-02) the float32 differences on seeds 0, 3, 4, 5, 6 are 9.0e-7, 1.8e-6, 3.0e-6,
# 1.6e-7, 5.7e-7 (seeds 1 and 2 give fewer than 2 pairs); seed 5 is used (before: seed 3).
@pytest.mark.parametrize(
    ("dtype", "seed", "bound"), [(torch.float32, 5, 1e-6), (torch.float64, 4, 1e-12)],
    ids=["float32", "float64"],
)  # fmt: skip
def test_an_update_with_preferences_lands_where_graphgpo_lands(
    warm_model, monkeypatch, dtype, seed, bound
):
    policy, tokenizer = load_policy(warm_model)
    options = CollectOptions(
        group_size=8, split="train", temperature=1.0, history=1, max_new_tokens=1,
        response_format="action", seed=seed,
    )  # fmt: skip
    learnable = collect(policy, tokenizer, CoinEnv, [0, 1, 2, 3], options).learnable()
    policy = policy.to(dtype)  # sampled in float32 either way: the same batch
    table, tokens = learnable.table, learnable.tokens
    graph = assign_credit(table, resolve_algo(AlgoConfig(name="graphgpo"), 8))
    mc = assign_credit(table, resolve_algo(AlgoConfig(name="mcgpo"), 8))
    np.testing.assert_array_equal(graph.advantages, mc.advantages)  # MCGPO's are GraphGPO's
    # 4 groups of 8 one-turn rows; mini-batches of 8 rows = one group each (4 steps per
    # epoch, 2 epochs); micro-batches of 3 rows (odd: partners must still stay together)
    assert len(table) == 32 and len(mc.plus) >= 2
    cfg = TrainConfig(
        lr=1e-3, weight_decay=0.0, ppo_epochs=2, mini_batch_size=8, micro_batch_size=3
    )
    ref = copy.deepcopy(policy).requires_grad_(False)
    arms = {
        "graphgpo": (PairBatch.empty(), 0.0),
        "mcgpo": (PairBatch(mc.plus, mc.minus, mc.weight), 1e-9),
    }
    layouts, weights, stats = {}, {}, {}
    for name, (pairs, lam) in arms.items():
        model = copy.deepcopy(policy)
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
        with monkeypatch.context() as patch:
            steps = spy_layout(patch, optimizer)
            stats[name] = update_policy(
                model, optimizer, tokens, graph.advantages, cfg, pairs=pairs, lambda_pair=lam,
                ref_model=ref, groups=table.group,
            )  # fmt: skip
        layouts[name] = [s for s in steps if s]
        weights[name] = {k: v.detach().clone() for k, v in model.state_dict().items()}

    # the same rows in every optimiser step, in the same order; the pairs spread over them
    rows_per_step = {k: [sorted(np.concatenate(s).tolist()) for s in v] for k, v in layouts.items()}
    assert rows_per_step["mcgpo"] == rows_per_step["graphgpo"]
    assert rows_per_step["graphgpo"] == [list(range(g * 8, g * 8 + 8)) for g in range(4)] * 2
    assert all(len(step) >= 2 for step in layouts["mcgpo"])  # >= 2 micro-batches each
    assert len({int(table.group[r]) for r in mc.plus}) >= 2  # paired rows in >= 2 steps
    s = stats["mcgpo"]
    assert s["update/optimizer_steps"] == stats["graphgpo"]["update/optimizer_steps"] == 8.0
    assert s["pairs/split_mini"] == s["pairs/split_micro"] == 0.0
    assert s["pairs/used"] == len(mc.plus)
    # weights within the bound (see above); the update itself moved them by far more
    start = policy.state_dict()
    diff = max(float((weights["mcgpo"][k] - weights["graphgpo"][k]).abs().max()) for k in start)
    moved = max(float((weights["graphgpo"][k] - start[k]).abs().max()) for k in start)
    assert diff < bound and moved > 1e-3, (diff, moved)


@pytest.mark.slow
def test_a_run_with_preferences_matches_graphgpo(warm_model, coin, tmp_path):
    """``mcgpo train`` twice from the same warm start and seed: GraphGPO, and MCGPO with
    lambda_pair = 1e-9. Two updates of 2 groups x 8 siblings, mini-batches of one group."""
    runs = {}
    for name, extra in (("graphgpo", ()), ("mcgpo", ("--algo.lambda_pair", "1e-9"))):
        out = tmp_path / name
        args = [
            "train", *COIN, "--model", str(warm_model), "--out", str(out), "--algo.name", name,
            "--deterministic", "true", "--rollout.group_size", "8", "--train.mini_batch_size",
            "8", "--train.micro_batch_size", "3", "--train.weight_decay", "0", *extra,
        ]  # fmt: skip
        assert main(args) == 0
        runs[name] = out
    g, m = (read_metrics(runs[k] / "metrics.jsonl") for k in ("graphgpo", "mcgpo"))
    assert sum(r.get("pairs/given", 0.0) for r in m) > 0  # preferences did occur
    assert sum(r.get("pairs/used", 0.0) for r in m) > 0
    assert all(r.get("pairs/split_mini", 0.0) == 0.0 for r in m)
    keys = (
        "rollout/success_rate", "rollout/rows", "update/optimizer_steps", "eval/success",
        "eval/score", "eval/turns",
    )  # fmt: skip
    assert [[r.get(k) for k in keys] for r in g] == [[r.get(k) for k in keys] for r in m]
    assert [r["update/optimizer_steps"] for r in g if "update/rows" in r] == [2.0, 2.0]
    wg, wm = (load_file(str(Path(runs[k]) / "model" / "model.safetensors")) for k in runs)
    start = load_file(str(Path(warm_model) / "model.safetensors"))
    diff = max(float((wg[k] - wm[k]).abs().max()) for k in wg)
    moved = max(float((wg[k] - start[k]).abs().max()) for k in wg)
    assert diff < 1e-6 and moved > 1e-4, (diff, moved)
