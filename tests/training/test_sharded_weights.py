"""Policy folders written under 2 gloo ranks, whole and sharded in place.

Every rank's vLLM engine reads a folder of its own, which transformers' ``save_pretrained``
leaves without weights on ranks > 0 (it writes on rank 0 only): every rank's
:func:`mcgpo.policy.write_policy`, of a whole policy (DDP, a replica) and of one sharded in
place (``train.fsdp_replica false``), and rank 0's
:func:`mcgpo.training.learner.full_model_state` (checkpoints, the final model) give back
the unsharded weights exactly, under the names ``save_pretrained`` writes, and the folders
load in one process as the original does. Both a tied head (the tiny policy) and an
untied one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from ranks import saved_weights

RANK = """
import sys
import torch
import torch.distributed as dist
from mcgpo.policy import holds_shards, load_policy, save_policy, write_policy
from mcgpo.training.distributed import current_world, leave_launched_process
from mcgpo.training.learner import full_model_state, shard_policy

model_dir, out = sys.argv[1:3]
dist.init_process_group("gloo")
world = current_world()
torch.set_num_threads(1)
policy, tokenizer = load_policy(model_dir)
whole = sum(p.numel() for p in policy.parameters())
write_policy(policy, tokenizer, f"{out}/whole-rank{world.rank}")  # a replica's engine folder
shard_policy(policy, copy_model=False)  # in place, as setup_run does without a replica
assert holds_shards(policy)
local = sum(p.to_local().numel() for p in policy.parameters())
assert local < 0.75 * whole, (local, whole)  # this rank holds about half
write_policy(policy, tokenizer, f"{out}/engine-rank{world.rank}")  # every rank its own
state = full_model_state(policy)
if world.rank == 0:
    save_policy(policy, tokenizer, f"{out}/final", state_dict=state)
else:
    assert state == {}
dist.barrier()
dist.destroy_process_group()
leave_launched_process(0)
"""


def _untied(micro_model: Path, folder: Path) -> Path:
    """The micro policy with its own LM head (a copy of the embedding, perturbed)."""
    import torch

    from mcgpo.policy import load_policy, save_policy

    model, tokenizer = load_policy(micro_model)
    model.config.tie_word_embeddings = False
    head = model.get_input_embeddings().weight.detach().clone() + 0.01
    model.lm_head.weight = torch.nn.Parameter(head)
    return save_policy(model, tokenizer, folder)


@pytest.mark.slow
@pytest.mark.parametrize("head", ["tied", "untied"])
def test_a_sharded_policy_is_read_and_saved_whole(micro_model, tmp_path, head):
    source = micro_model if head == "tied" else _untied(micro_model, tmp_path / "untied")
    (tmp_path / "rank.py").write_text(textwrap.dedent(RANK))
    src = Path(__file__).parents[2] / "src"
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
        str(tmp_path / "rank.py"), str(source), str(tmp_path / "out"),
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    want = saved_weights(source)
    assert ("lm_head.weight" in want) == (head == "untied")
    from mcgpo.policy import load_policy

    for name in ("whole-rank0", "whole-rank1", "engine-rank0", "engine-rank1", "final"):
        got = saved_weights(tmp_path / "out" / name)
        assert got.keys() == want.keys(), name
        assert all(bool((got[k] == want[k]).all()) for k in want), name
        model, _ = load_policy(tmp_path / "out" / name)  # an ordinary --model folder
        logits = model.lm_head.weight
        assert bool((logits == load_policy(source)[0].lm_head.weight).all()), name
