"""The pair loss across processes: 2 ranks (gloo) = 1 process, with preference pairs.

The end-to-end multi-process tests (test_distributed.py) play random micro policies whose
batches hold no preference pairs, so they never run MCGPO's pair loss on W > 1. Here the
update itself runs on a batch with pairs: 4 task groups of 4 rows, pairs inside groups 1
and 3, mini-batches of one group each (4 optimiser steps per epoch, 2 epochs) and
micro-batches of 3 rows. Rank 0 holds groups 0-1 and rank 1 groups 2-3 (contiguous blocks,
as the trainer splits them), so each rank has steps without any row of its own while it
holds pairs (the case that crashed `pairs_inside` on an empty row set), and the pair loss's
normaliser ``|B| / |M|`` must use the global mini-batch size. The single-process update on
the whole batch is the reference; float64 runs show that what is left in float32 is rounding.
With ``train.rollout_correction tis`` the sampler's log-probs (shifted from pi_old on some
rows) travel with the token rows to the rank that runs them, beside the recomputed pi_old.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from mcgpo.training.update import PairBatch, update_policy

# Shared by the test process and each rank (written into the rank script): the same batch,
# advantages, pairs and config everywhere, from fixed seeds.
SETUP = """
import numpy as np
import torch
from mcgpo.policy import load_policy, token_log_probs
from mcgpo.rollout.tokens import TokenBatch
from mcgpo.training.config import TrainConfig
from mcgpo.training.update import PairBatch

GROUPS, SIZE = 4, 4
PLUS, MINUS, WEIGHT = [4, 6, 12, 13], [5, 7, 14, 15], [0.5, 1.0, 0.25, 1.0]


def problem(model_dir, dtype="float32", correction="none"):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    policy, tokenizer = load_policy(model_dir)
    policy = policy.to(getattr(torch, dtype))
    gen = np.random.default_rng(0)
    vocab = len(tokenizer)
    prompts = [gen.integers(3, vocab, gen.integers(4, 9)).tolist() for _ in range(16)]
    responses = [gen.integers(3, vocab, gen.integers(1, 4)).tolist() for _ in range(16)]
    zeros = [[0.0] * len(r) for r in responses]
    batch = TokenBatch.from_sequences(prompts, responses, zeros, pad_token_id=0)
    with torch.no_grad():
        old = token_log_probs(policy, batch.input_ids, batch.attention_mask)
    old = torch.where(batch.response_mask, old, 0.0)
    # the sampler's log-probs: pi_old's, or (a correction) 0.9 nats below it on every 3rd
    # row (ratio e^0.9 = 2.46, truncated at 2) and 0.3 above on the next (ratio 0.74)
    shift = torch.tensor([[0.9], [-0.3], [0.0]] * 6)[:16].to(old.dtype)
    behaviour = old - shift * batch.response_mask if correction != "none" else old
    batch = TokenBatch(
        batch.input_ids, batch.attention_mask, batch.response_mask, old, behaviour
    )
    advantages = gen.normal(size=16).astype(np.float32)
    pairs = PairBatch(np.array(PLUS), np.array(MINUS), np.array(WEIGHT))
    groups = np.repeat(np.arange(GROUPS), SIZE)
    cfg = TrainConfig(
        lr=1e-2, weight_decay=0.0, ppo_epochs=2, mini_batch_size=4, micro_batch_size=3,
        kl_coef=0.01, rollout_correction=correction, old_logprobs_check=True,
    )
    return policy, batch, advantages, pairs, groups, cfg
"""

RANK = """
import json
import sys
import copy
import torch
import numpy as np
import torch.distributed as dist
from setup_problem import problem
from mcgpo.training.distributed import (
    current_world, distributed_learner, distributed_reference, copy_full_weights, rank_block,
    leave_launched_process, sharded,
)
from mcgpo.training.update import PairBatch, update_policy

model_dir, sharding, dtype, out, correction = sys.argv[1:6]
dist.init_process_group("gloo")
world = current_world()
policy, batch, advantages, pairs, groups, cfg = problem(model_dir, dtype, correction)
ref = copy.deepcopy(policy).eval().requires_grad_(False)
mine = np.asarray(rank_block(4, world))  # this rank's task groups
rows = np.flatnonzero(np.isin(groups, mine))
keep = np.isin(pairs.plus, rows) & np.isin(pairs.minus, rows)
local = PairBatch(pairs.plus[keep] - rows[0], pairs.minus[keep] - rows[0], pairs.weight[keep])
learner = distributed_learner(policy, sharding, world)
full = sum(p.numel() for p in ref.parameters())
ref = distributed_reference(ref, sharding, world)  # FSDP2: sharded like the learner
ref_local = sum(getattr(p, "_local_tensor", p).numel() for p in ref.parameters())
optimizer = torch.optim.AdamW(learner.parameters(), lr=cfg.lr, weight_decay=0.0)
stats = update_policy(
    learner, optimizer, batch.select(rows), advantages[rows], cfg, pairs=local,
    lambda_pair=1.0, ref_model=ref, groups=groups[rows], world=world,
)
if sharding == "fsdp2":
    copy_full_weights(learner, policy)
if world.rank == 0:
    torch.save({k: v.clone() for k, v in policy.state_dict().items()}, out)
# each rank writes its own file: two ranks' prints on one shared pipe can interleave
with open(f"{out}.rank{world.rank}.json", "w") as f:
    json.dump({"used": stats["pairs/used"], "split": stats["pairs/split_micro"],
               "ref_sharded": sharded(ref), "ref_share": ref_local / full,
               "pooled": {k: v for k, v in stats.items()
                          if k.startswith(("rollout_correction/", "pi_old/"))}}, f)
# as mcgpo's own ranks end (distributed.joined_world, leave_launched_process): together,
# and without the interpreter shutdown that races gloo's release of finished work (SIGABRT)
dist.barrier()
dist.destroy_process_group()
leave_launched_process(0)
"""


def _single(model_dir: Path, tmp_path: Path, dtype: str, correction: str = "none"):
    sys.path.insert(0, str(tmp_path))
    try:
        from setup_problem import problem
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("setup_problem", None)
    policy, batch, advantages, pairs, groups, cfg = problem(str(model_dir), dtype, correction)
    import copy

    ref = copy.deepcopy(policy).eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=0.0)
    start = {k: v.clone() for k, v in policy.state_dict().items()}
    stats = update_policy(
        policy, optimizer, batch, advantages, cfg, pairs=pairs, lambda_pair=1.0,
        ref_model=ref, groups=groups,
    )  # fmt: skip
    return start, policy.state_dict(), stats


# Measured (2-core CPU): DDP 0.0 in float32 and float64 (the same sums in the same order);
# FSDP2 2.4e-14 in float64 and 2.6e-5 in float32 (lr 1e-2, 8 AdamW steps that moved the
# weights by up to 0.075): its gradients are reduce-scattered and the optimiser steps on
# shards, another order of the same sums; float64 shows that the float32 residual is
# rounding, which AdamW amplifies on entries whose gradient is near its eps.
BOUND = {
    ("ddp", "float32"): 1e-5, ("ddp", "float64"): 1e-12,
    ("fsdp2", "float32"): 1e-4, ("fsdp2", "float64"): 1e-12,
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("sharding", ["ddp", "fsdp2"])
def test_two_ranks_with_pairs_update_as_one_process(micro_model, tmp_path, sharding, dtype):
    _two_ranks_as_one(micro_model, tmp_path, sharding, dtype, "none")


@pytest.mark.slow
def test_two_ranks_with_a_rollout_correction_update_as_one_process(micro_model, tmp_path):
    single = _two_ranks_as_one(micro_model, tmp_path, "ddp", "float64", "tis")
    _, uncorrected, _ = _single(micro_model, tmp_path, "float64", "none")
    # the correction changed the update (else the equality above would prove nothing)
    assert max(float((single[k] - uncorrected[k]).abs().max()) for k in single) > 1e-4


def _two_ranks_as_one(micro_model, tmp_path, sharding, dtype, correction):
    """Run the 2-rank update and the single process's; assert they agree; return the
    single process's weights."""
    (tmp_path / "setup_problem.py").write_text(textwrap.dedent(SETUP))
    (tmp_path / "rank.py").write_text(textwrap.dedent(RANK))
    out = tmp_path / "two.pt"
    src = Path(__file__).parents[2] / "src"
    env = {**os.environ, "PYTHONPATH": f"{src}:{tmp_path}", "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
        "--standalone", str(tmp_path / "rank.py"), str(micro_model), sharding, dtype, str(out),
        correction,
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    used = [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(2)]
    start, single, stats = _single(micro_model, tmp_path, dtype, correction)
    # every pair entered the loss in both runs, none was split across micro-batches
    assert stats["pairs/used"] == 4.0 and stats["pairs/split_micro"] == 0.0
    assert [u["used"] for u in used] == [2.0, 2.0]  # two pairs on each rank
    assert [u["split"] for u in used] == [0.0, 0.0]
    # FSDP2 shards the KL reference too (each rank holds about half of it); DDP keeps it whole
    for u in used:
        assert u["ref_sharded"] == (sharding == "fsdp2")
        assert (0.4 < u["ref_share"] < 0.6) if sharding == "fsdp2" else u["ref_share"] == 1.0
    two = torch.load(out)
    diff = max(float((two[k] - single[k]).abs().max()) for k in single)
    moved = max(float((single[k] - start[k]).abs().max()) for k in single)
    assert diff < BOUND[sharding, dtype] and moved > 1e-2, (diff, moved)
    if correction != "none":  # the single process saw the shifted rows: truncated at 2
        assert stats["rollout_correction/clipped_frac"] > 0
        assert stats["rollout_correction/ratio_max"] == pytest.approx(math.exp(0.9), rel=1e-5)
        # the ranks' rollout_correction/* and pi_old/* statistics are those of all rows, as
        # the single process computes them (pooled sums), not means of per-rank means; the
        # maxima are each rank's own, merged by the largest. Both are float32 metrics
        # (TokenBatch keeps log-probs in float32; one process takes float32 means, the
        # ranks' pooled sums are float64), so within 1e-6 relative
        keys = [k for k in stats if k.startswith(("rollout_correction/", "pi_old/"))]
        assert len(keys) == 11 and stats["pi_old/mean_abs_diff"] > 0.1, keys
        for key in keys:
            ranks = [u["pooled"][key] for u in used]
            if "max" in key:
                assert max(ranks) == pytest.approx(stats[key], rel=1e-6), key
            else:
                assert ranks[0] == ranks[1] == pytest.approx(stats[key], rel=1e-6, abs=1e-9), key
    return single


def test_pairs_inside_an_empty_row_set_is_empty():
    """A rank with no rows in a step (other ranks' groups only) keeps no pair of its own."""
    from mcgpo.training.layout import pairs_inside

    pairs = PairBatch(np.array([4, 6]), np.array([5, 7]), np.array([0.5, 1.0]))
    inside = pairs_inside(np.zeros(0, dtype=np.int64), pairs)
    assert len(inside.plus) == len(inside.minus) == len(inside.weight) == 0
    some = pairs_inside(np.array([7, 6, 9]), pairs)
    assert some.plus.tolist() == [1] and some.minus.tolist() == [0]  # rows 6 -> 1, 7 -> 0
