"""Training across processes (gloo on CPU): the batch split, the merge, and 2 ranks vs 1.

Sampling does not depend on the rank: every environment draws from its own generator,
seeded from (seed, update, global group index, slot) (:mod:`mcgpo.rollout.group_rollout`), so 2
ranks and 1 process sample the same rollouts at the preset's temperature 1 (tested below).
The other runs sample at temperature 0.001 (every draw is the arg-max, a function of the
policy only), which keeps them independent of that rule.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from ranks import launch, saved_weights

from mcgpo.cli import main
from mcgpo.steps import StepTable
from mcgpo.training.distributed import World, merge_metrics, rank_block, union_tables

GREEDY = ("--rollout.temperature", "0.001", "--eval.temperature", "0.001", "--tensorboard", "false")
# the preset's sampling (T = 1 rollouts, T = 0.4 evaluation) with one-token actions: with
# the preset's 4 tokens the micro policy's actions all pass the format check, every reward is
# 0 and so is every advantage; with 1 token some actions are empty (format penalty -0.1), so
# the advantages compared below are not all 0. (No pairs: random actions rarely repeat, so
# MCGPO finds no supported candidate; pairs are compared all the same.)
PRESET = ("--tensorboard", "false", "--rollout.max_new_tokens", "1")


@given(st.integers(0, 50), st.integers(1, 8))
def test_rank_blocks_tile_the_range_in_order(total: int, size: int) -> None:
    blocks = [rank_block(total, World(r, size)) for r in range(size)]
    assert [i for b in blocks for i in b] == list(range(total))
    assert max(map(len, blocks)) - min(map(len, blocks)) <= 1


def _table(groups: int, size: int) -> StepTable:
    one = {"turn": 0, "reward": 0.0, "done": True, "success": 0.0, "score": 0.0, "action": "a",
           "action_valid": True, "anchor": "s", "next_anchor": "t"}  # fmt: skip
    rows = [
        {"group": g, "traj": g * size + s, "slot": s, **one}
        for g in range(groups)
        for s in range(size)
    ]
    return StepTable.from_records(rows)


def test_union_renumbers_groups_and_trajectories_after_earlier_ranks() -> None:
    # rank 0: groups 0, 1; rank 1: its group 0 is global group 2, trajs 2*3 + slot
    joined = union_tables([_table(2, 3), _table(1, 3)], group_size=3)
    assert joined.group.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert joined.traj.tolist() == list(range(9))


def test_merge_sums_counts_averages_rates_and_takes_the_slowest_time() -> None:
    a = {"rollout/rows": 10.0, "rollout/success_rate": 0.5, "time/update": 1.0}
    b = {"rollout/rows": 14.0, "rollout/success_rate": 0.25, "time/update": 3.0, "x": 2.0}
    assert merge_metrics([a, b]) == {
        "rollout/rows": 24.0,
        "rollout/success_rate": 0.375,
        "time/update": 3.0,
        "x": 2.0,  # reported by one rank only: its value
    }


def test_merge_takes_the_largest_rank_of_peaks_and_maxima() -> None:
    a = {"memory/update_peak_gb": 3.0, "pi_old/max_abs_diff": 1e-3, "pi_old/mean_abs_diff": 0.25}
    b = {"memory/update_peak_gb": 5.0, "pi_old/max_abs_diff": 4e-3, "pi_old/mean_abs_diff": 0.75}
    c = {"pi_old/ratio_max_dev_at_old": 0.5}
    d = {"pi_old/ratio_max_dev_at_old": 0.25}
    assert merge_metrics([a, b]) == {
        "memory/update_peak_gb": 5.0,  # the machine's need is the largest rank's
        "pi_old/max_abs_diff": 4e-3,  # a maximum over the global batch
        "pi_old/mean_abs_diff": 0.5,  # a mean: averaged (equal-sized blocks)
    }
    assert merge_metrics([c, d]) == {"pi_old/ratio_max_dev_at_old": 0.5}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--nproc", "0"), "nproc must be >= 1, got 0"),
        (("--nproc", "3"), "rollout.groups (2) must be divisible by the world size (3)"),
        (("--backend", "mpi"), "backend must be one of auto, gloo, nccl; got 'mpi'"),
        (("--nproc", "2", "--backend", "nccl"), "backend nccl needs device cuda"),
    ],
)
def test_bad_world_settings_are_one_line_exit_2(tmp_path, smoke_args, capsys, extra, message):
    assert main(smoke_args(tmp_path / "run", *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err


@pytest.mark.slow
def test_two_processes_evaluate_as_one(tmp_path, micro_model):
    """``mcgpo eval --nproc 2``: 3 held-out tasks split 2 + 1 over the ranks, sampled at the
    preset's eval temperature (0.4); every episode draws from its global index's stream, so
    eval.json holds the single process's numbers. Rank 0 alone writes it."""
    import json

    def args(out, *extra):
        return ["eval", "--preset", "household-smoke", "--model", str(micro_model), "--out",
                str(out), "--eval.tasks", "3", *extra]  # fmt: skip

    one, two = tmp_path / "one", tmp_path / "two"
    assert main(args(one)) == 0
    launch(args(two, "--nproc", "2"))
    a, b = (json.loads((f / "eval.json").read_text()) for f in (one, two))
    assert (a.pop("processes"), b.pop("processes")) == (1, 2)
    assert a["eval/episodes"] == 3.0 and a["eval/turns"] > 1.0
    drop = ("command", "eval/time")
    assert {k: v for k, v in a.items() if k not in drop} == {
        k: v for k, v in b.items() if k not in drop
    }
    assert sorted(p.name for p in two.iterdir()) == ["eval.json"]  # no config.toml, no tmp


def _rows(folder: Path, update: int, ranks: int):
    import pandas as pd

    names = [f"update-{update:06d}.parquet"] if ranks == 1 else [
        f"update-{update:06d}-rank{r}.parquet" for r in range(ranks)
    ]  # fmt: skip
    return pd.concat([pd.read_parquet(folder / "rollouts" / n) for n in names], ignore_index=True)


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [PRESET, GREEDY], ids=["preset-T1", "greedy"])
def test_two_processes_train_as_one(tmp_path, smoke_args, sampling):
    """2 ranks vs 1 process: the same rows, advantages and pairs at every update, the same
    evaluations, and final weights within 1e-5. The residual (about 1e-7 here) is float
    rounding: each rank cuts its half of a mini-batch into its own micro-batches and DDP sums
    the two halves' gradients, so the sums run in another order; the loss normalisers are
    the global counts."""
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(smoke_args(one, *sampling, "--save-rollouts")) == 0
    launch(smoke_args(two, *sampling, "--save-rollouts", "--nproc", "2"))
    for update in (1, 2):
        a, b = _rows(one, update, 1), _rows(two, update, 2)
        assert len(a) == len(b) > 0
        same = ["slot", "turn", "action", "reward", "success", "state", "response", "pair_role"]
        for column in same:
            assert a[column].tolist() == b[column].tolist(), column
        np.testing.assert_allclose(a["advantage"], b["advantage"], rtol=0, atol=1e-12)
        np.testing.assert_array_equal(a["pair_weight"], b["pair_weight"])
        assert (a["advantage"] != 0).any()
    from mcgpo.training.metrics import read_metrics

    evals = [
        [{k: v for k, v in r.items() if k.startswith("eval/") and k != "eval/time"} for r in rs]
        for rs in (read_metrics(one / "metrics.jsonl"), read_metrics(two / "metrics.jsonl"))
    ]
    assert evals[0] == evals[1] and any(evals[0])
    wa, wb = saved_weights(one / "model"), saved_weights(two / "model")
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-5
    assert "config.toml" in os.listdir(two) and "nproc = 2" in (two / "config.toml").read_text()


@pytest.mark.slow
def test_two_processes_resume_as_uninterrupted(tmp_path, smoke_args):
    whole, split = tmp_path / "whole", tmp_path / "split"
    launch(smoke_args(whole, *GREEDY, "--nproc", "2"))
    launch(smoke_args(split, *GREEDY, "--nproc", "2", "--train.updates", "1"))
    launch(smoke_args(split, *GREEDY, "--nproc", "2", "--resume"))
    wa, wb = saved_weights(whole / "model"), saved_weights(split / "model")
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-6
    # the same world size only: a 1-process resume of a 2-process run is refused (without
    # --nproc the resume takes the run's own 2 from its config.toml)
    assert main(smoke_args(split, *GREEDY, "--nproc", "1", "--resume")) == 2


@pytest.mark.slow
def test_steps_that_one_rank_has_no_rows_of_match_one_process(tmp_path, smoke_args):
    """mini_batch_size 4 puts each 12-row group in a step of its own: step 1 holds rank 0's
    group only, step 2 rank 1's, so the other rank joins the all-reduce with a zero loss;
    micro_batch_size 5 gives the ranks cuts the single process does not make. 3 held-out
    tasks split 2 + 1 over the ranks and gathered."""
    extra = (*GREEDY, "--train.mini_batch_size", "4", "--train.micro_batch_size", "5")
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(smoke_args(one, *extra, "--eval.tasks", "3")) == 0
    launch(smoke_args(two, *extra, "--eval.tasks", "3", "--nproc", "2"))
    wa, wb = saved_weights(one / "model"), saved_weights(two / "model")
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-5
    from mcgpo.training.metrics import read_metrics

    ra, rb = read_metrics(one / "metrics.jsonl"), read_metrics(two / "metrics.jsonl")
    evals = [[r for r in rs if "eval/episodes" in r] for rs in (ra, rb)]
    for a, b in zip(*evals, strict=True):
        assert {k: v for k, v in a.items() if k.startswith("eval/") and k != "eval/time"} == {
            k: v for k, v in b.items() if k.startswith("eval/") and k != "eval/time"
        }
    steps = [[r["update/optimizer_steps"] for r in rs if "update/rows" in r] for rs in (ra, rb)]
    assert steps[0] == steps[1] == [2.0, 2.0]


def _walk(group: int, traj: int, observations: str, won: bool) -> list[dict]:
    last = len(observations) - 2
    return [
        {"group": group, "traj": traj, "slot": traj % 4, "turn": t,
         "reward": 10.0 if won and t == last else 0.0, "done": t == last,
         "success": float(won), "score": float(won), "action": f"go to {observations[t + 1]}",
         "action_valid": True, "anchor": observations[t], "next_anchor": observations[t + 1]}
        for t in range(len(observations) - 1)
    ]  # fmt: skip


def test_progress_gpo_fail_share_counts_the_whole_batch_on_every_rank(monkeypatch):
    """progress_gpo with scale_by_fail_share on 2 ranks: the single process's advantages.
    One process holds 3 groups: 0 and 2 all-fail, 1 mixed, so lam = 0.3 x 2/3. Rank 0 holds
    groups 0, 1 (its own share 1/2), rank 1 group 2 (share 1/1); summing the counts over
    the ranks (all_sum, stood in for here by the two ranks' counts) gives both 2/3."""
    from mcgpo.training import collectives
    from mcgpo.training.algorithms import assign_credit, resolve_algo
    from mcgpo.training.config import AlgoConfig

    rank0 = _walk(0, 0, "OPQR", False) + _walk(0, 1, "OPOP", False) + _walk(0, 2, "OOP", False)
    rank0 += _walk(1, 4, "OW", True) + _walk(1, 5, "OOO", False)
    rank1 = _walk(0, 0, "OPQ", False) + _walk(0, 1, "OOO", False)  # global group 2
    parts = [StepTable.from_records(rank0), StepTable.from_records(rank1)]
    whole = union_tables(parts, group_size=4)
    given = {"lam": 0.3, "scale_by_fail_share": True}
    algo = resolve_algo(AlgoConfig(name="progress_gpo", estimator=given), group_size=4)
    one = assign_credit(whole, algo)
    assert one.stats["adv/lam_effective"] == pytest.approx(0.3 * 2 / 3)
    counts = [np.array([1.0, 2.0]), np.array([1.0, 1.0])]  # (all-fail groups, groups)
    monkeypatch.setattr(collectives, "all_sum", lambda values, world: counts[0] + counts[1])
    advantages = []
    for rank, part in enumerate(parts):
        fixed = collectives.whole_batch_algo(algo, part, World(rank, 2))
        assert fixed.estimator["scale_by_fail_share"] is False
        advantages.append(assign_credit(part, fixed).advantages)
    np.testing.assert_array_equal(np.concatenate(advantages), one.advantages)
    assert (one.advantages != 0).any()
    # one process, or another estimator: the config as given
    assert collectives.whole_batch_algo(algo, whole, World()) is algo


@pytest.mark.slow
def test_progress_gpo_fail_share_trains_on_two_processes_as_one(tmp_path, smoke_args):
    extra = (*GREEDY, "--algo.name", "progress_gpo", "--algo.scale_by_fail_share", "true")
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(smoke_args(one, *extra, "--save-rollouts")) == 0
    launch(smoke_args(two, *extra, "--save-rollouts", "--nproc", "2"))
    for update in (1, 2):
        a, b = _rows(one, update, 1), _rows(two, update, 2)
        np.testing.assert_allclose(a["advantage"], b["advantage"], rtol=0, atol=1e-12)
    wa, wb = saved_weights(one / "model"), saved_weights(two / "model")
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-5


@given(
    st.lists(st.integers(1, 7), min_size=1, max_size=12),
    st.integers(1, 4),
    st.integers(0, 20),
    st.integers(0, 5),
)
def test_ranks_deal_every_micro_batch_of_the_single_process_layout_once(
    sizes, world_size, size, micro
):
    """Each micro-batch of every step of the single process's layout goes to exactly one
    rank, unchanged and in its order; a rank's share of a step is balanced (greedy, largest
    first: no rank ends more than one micro-batch's cost above the least loaded)."""
    from mcgpo.rollout import TokenBatch
    from mcgpo.training import layout as plan
    from mcgpo.training.config import TrainConfig

    groups = np.repeat(np.arange(len(sizes)), sizes)
    n = len(groups)
    gen = np.random.default_rng(n)
    prompts = [[1] * int(gen.integers(1, 6)) for _ in range(n)]
    batch = TokenBatch.from_sequences(prompts, [[2]] * n, [[0.0]] * n, pad_token_id=0)
    cfg = TrainConfig(mini_batch_size=size, micro_batch_size=micro)
    layout = plan.plan_layout(batch, cfg, plan.PairBatch.empty(), groups)
    lengths = batch.attention_mask.sum(1).numpy()
    shares = plan.deal(layout, lengths, world_size)
    assert len(shares) == world_size
    for k, micros in enumerate(layout.steps):
        dealt = [rows[m] for share, rows in shares for m in share.steps[k]]
        assert sorted(map(tuple, dealt)) == sorted(map(tuple, micros))  # each exactly once
        for share, rows in shares:  # a rank's micro-batches keep the layout's order
            mine = [tuple(rows[m]) for m in share.steps[k]]
            assert mine == [tuple(m) for m in micros if tuple(m) in mine]
        costs = [
            [len(rows[m]) * lengths[rows[m]].max() for m in sh.steps[k]] for sh, rows in shares
        ]
        loads = [sum(c) for c in costs]
        largest = max((len(m) * lengths[m].max() for m in micros), default=0)
        assert max(loads) - min(loads) <= largest
    for share, rows in shares:
        assert share.rows == layout.rows and share.tokens == layout.tokens  # whole steps
        assert rows.tolist() == sorted(
            {int(r) for micros in share.steps for m in micros for r in rows[m]}
        )


def test_the_outline_shifts_rows_pairs_and_groups_past_earlier_ranks(monkeypatch):
    """What every rank gathers: rank 0's 3 rows (groups 0, 1) then rank 1's 2 rows (group 0
    of its own), pairs and groups renumbered as in the single process; no tokens."""
    from mcgpo.rollout import TokenBatch
    from mcgpo.training import layout as plan

    def part(widths, plus, minus, groups):
        batch = TokenBatch.from_sequences(
            [[1] * w for w in widths], [[2]] * len(widths), [[0.0]] * len(widths), pad_token_id=0
        )
        pairs = plan.PairBatch(np.array(plus), np.array(minus), np.array([0.5] * len(plus)))
        return batch, np.arange(len(widths), dtype=np.float32), pairs, np.array(groups)

    parts = [part([2, 3, 1], [0], [1], [0, 0, 1]), part([4, 1], [1], [0], [0, 0])]
    seen = []

    def gather(obj, world):
        seen.append(obj)  # this rank's contribution: small arrays only
        return [
            (b.attention_mask.sum(1).numpy(), b.response_mask.sum(1).numpy(), a, p, g)
            for b, a, p, g in parts
        ]

    monkeypatch.setattr(plan, "gather_objects", gather)
    whole = plan.batch_outline(*parts[1], World(1, 2))
    assert not any(isinstance(x, TokenBatch) for x in seen[0])
    assert whole.lengths.tolist() == [3, 4, 2, 5, 2] and whole.responses.tolist() == [1] * 5
    assert whole.advantages.tolist() == [0, 1, 2, 0, 1] and whole.advantages.dtype == np.float32
    assert whole.pairs.plus.tolist() == [0, 4] and whole.pairs.minus.tolist() == [1, 3]
    assert whole.groups.tolist() == [0, 0, 1, 2, 2] and whole.starts.tolist() == [0, 3, 5]


def test_fetch_rows_sends_each_rank_only_the_rows_it_runs(monkeypatch):
    """Rank 1 holds whole-batch rows 3, 4; it runs rows 0, 4 and rank 0 runs 1, 2, 3. It
    sends row 3 to rank 0, keeps row 4 and receives row 0 from rank 0 (the exchange is
    faked: rank 0 would send it its row 0)."""
    from mcgpo.rollout import TokenBatch
    from mcgpo.training import layout as plan

    def rows(widths):
        return TokenBatch.from_sequences(
            [list(range(1, w + 1)) for w in widths], [[9]] * len(widths),
            [[-0.5]] * len(widths), pad_token_id=0,
        )  # fmt: skip

    whole = rows([2, 3, 1, 4, 1])
    sent = []

    def exchange(outgoing, world):
        sent.append(outgoing)
        return [whole.select([0]), outgoing[1]]  # from rank 0: row 0; from itself: row 4

    monkeypatch.setattr(plan, "exchange_objects", exchange)
    mine = whole.select([3, 4])
    wanted = [np.array([1, 2, 3]), np.array([0, 4])]
    got = plan.fetch_rows(mine, wanted, np.array([0, 3, 5]), World(1, 2))
    assert [len(b) for b in sent[0]] == [1, 1]
    assert sent[0][0].input_ids.tolist() == whole.select([3]).input_ids.tolist()
    expected = whole.select([0, 4])
    for name in ("input_ids", "attention_mask", "response_mask", "old_log_probs"):
        assert torch.equal(getattr(got, name), getattr(expected, name)), name


def test_threads_per_process_fit_the_cores_of_the_machine():
    from mcgpo.training.runtime import process_threads

    assert process_threads(2, 1, 2) == 2  # one process: as asked
    assert process_threads(2, 2, 2) == 1  # 2 x 2 threads on 2 cores: capped
    assert process_threads(4, 2, 16) == 4 and process_threads(8, 4, 16) == 4
    assert process_threads(3, 4, 2) == 1  # never below 1


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_nodes_on_localhost_train_as_one_machine(tmp_path, smoke_args):
    """Two torchrun invocations (--nnodes 2, one process each) meeting at a c10d rendezvous
    on 127.0.0.1 train what ``--nproc 2`` on one machine trains."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    two_nodes, one_node = tmp_path / "nodes", tmp_path / "node"
    endpoint = f"127.0.0.1:{_free_port()}"
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--nproc-per-node",
                "1",
                "--node-rank",
                str(rank),
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                endpoint,
                "--rdzv-id",
                "test-two-nodes",
                "-m",
                "mcgpo",
                *smoke_args(two_nodes, *GREEDY),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    for node in nodes:
        _, err = node.communicate(timeout=300)
        assert node.returncode == 0, err[-2000:]
    launch(smoke_args(one_node, *GREEDY, "--nproc", "2"))
    wa, wb = saved_weights(one_node / "model"), saved_weights(two_nodes / "model")
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) == 0.0


def test_exchange_objects_on_one_process_and_a_wrong_count():
    from mcgpo.training.distributed import exchange_objects

    assert exchange_objects(["a"], World()) == ["a"]
    with pytest.raises(ValueError, match="outgoing has 1 entries for 2 ranks"):
        exchange_objects(["a"], World(0, 2))


@pytest.mark.parametrize("fails", [False, True])
def test_joined_world_leaves_together_only_when_the_command_finished(monkeypatch, fails):
    """W > 1: a finished command meets the other ranks at a barrier before the process group
    is destroyed (no rank tears down its connections while another still has collectives
    queued); a failed one destroys at once (a barrier would wait for ranks that moved on)."""
    import torch.distributed as dist

    from mcgpo.training import distributed
    from mcgpo.training.config import RunConfig
    from mcgpo.training.distributed import World, joined_world

    calls: list[str] = []
    monkeypatch.setattr(distributed, "init_world", lambda cfg, kind: (cfg, World(1, 2, 1)))
    monkeypatch.setattr(dist, "barrier", lambda *a, **k: calls.append("barrier"))
    monkeypatch.setattr(dist, "destroy_process_group", lambda *a: calls.append("destroy"))
    with contextlib.suppress(RuntimeError), joined_world(RunConfig()) as (_, world):
        assert world.size == 2
        if fails:
            raise RuntimeError("a rank's command failed")
    assert calls == (["destroy"] if fails else ["barrier", "destroy"])


def test_a_launched_rank_exits_with_its_code_and_flushed_output(tmp_path):
    """leave_launched_process skips the interpreter shutdown (it races gloo's worker
    threads, see its docstring) but keeps the exit code and what the rank printed; atexit
    handlers do not run (the reason it exists), so nothing may rely on them."""
    script = (
        "import atexit, sys\n"
        "from mcgpo.training.distributed import leave_launched_process\n"
        "atexit.register(lambda: print('atexit ran'))\n"
        "print('summary without newline', end='')\n"
        "print('an error line', file=sys.stderr, end='')\n"
        "leave_launched_process(3)\n"
        "print('not reached')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 3
    assert done.stdout == "summary without newline"
    assert done.stderr == "an error line"
