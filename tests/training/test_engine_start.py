"""The vLLM engines of a 2-rank run start from one policy folder written once (issue 43
item 3): rank 0 writes ``<out>/rollout-engine`` while rank 1 waits, both engines start from
it, and a rank > 0 syncs through a folder of its own. vLLM is faked (its ``VLLMEngine``
records the folders it is given): what is tested is mcgpo's start-up, on 2 gloo ranks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

RANK = """
import json, sys
from pathlib import Path
import torch.distributed as dist
import mcgpo.rollout.vllm_launch as launch
import mcgpo.training.engine as engine_module
from mcgpo.policy import load_policy
from mcgpo.rollout.vllm_engine import VLLMEngine
from mcgpo.training.config import RunConfig
from mcgpo.training.distributed import current_world, leave_launched_process

model_dir, out = sys.argv[1:3]
dist.init_process_group("gloo")
world = current_world()
model, tokenizer = load_policy(model_dir)
writes, seen = [], {}
real_write = engine_module.write_policy

def counted_write(*args, **kwargs):
    writes.append(str(args[2]))
    return real_write(*args, **kwargs)

def fake_start(self, folder, *, sync_folder=None, **kwargs):
    weights = Path(folder) / "model.safetensors"
    seen.update(start=str(folder), sync=str(sync_folder), whole=weights.is_file(),
                rows=kwargs["rows"])

engine_module.write_policy = counted_write
launch.check_vllm = lambda model, platform: None
launch.backend = lambda: "cpu"
VLLMEngine.__init__ = fake_start
cfg = RunConfig(out=out)
engine_module.rollout_engine(cfg, model, tokenizer, Path(out), world)
Path(out, f"rank{world.rank}.json").write_text(json.dumps({"writes": writes, **seen}))
dist.barrier()
dist.destroy_process_group()
leave_launched_process(0)
"""


@pytest.mark.slow  # one 2-rank launch, about 15 s on 2 busy cores
def test_two_ranks_start_their_engines_from_one_copy_written_once(micro_model, tmp_path):
    (tmp_path / "rank.py").write_text(textwrap.dedent(RANK))
    src = Path(__file__).parents[2] / "src"
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    out = tmp_path / "run"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
        str(tmp_path / "rank.py"), str(micro_model), str(out),
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    start = str(out / "rollout-engine")
    assert ranks[0]["writes"] == [start] and ranks[1]["writes"] == []  # one copy, once
    assert [r["start"] for r in ranks] == [start, start]  # both engines start from it
    assert all(r["whole"] for r in ranks)  # rank 1 waited until the weights were there
    assert [r["sync"] for r in ranks] == [start, str(out / "rollout-engine-rank1")]
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("rollout")) == [
        "rollout-engine"
    ]  # nothing written for rank 1 before its first sync
    assert ranks[0]["rows"] == ranks[1]["rows"] > 0  # each rank's engine sized for its rows
