"""The chunked LM head (``train.logits_chunk``) on 2 ranks (gloo on CPU), DDP and FSDP2.

Under DDP and FSDP2 the learner is ``PolicyForward(policy)``: its one forward runs the body
and the chunked head, so DDP's reducer all-reduces the gradients and FSDP2's root unit
all-gathers the embeddings, final norm and head (issue 15: before, the chunked head called
``model.base_model`` on the DDP wrapper and failed; unwrapping ``.module`` would have skipped
the all-reduce). Each run is compared with one process with the same chunk: the rows and
the gradient norms are the same and the final weights agree within 1e-5 (float rounding:
the ranks sum their halves of each step apart; tests/training/test_distributed.py).

DDP runs the smoke layout (each step's rows split over both ranks: the all-reduce adds two
non-zero halves). FSDP2 runs an uneven one (mini_batch_size 4, micro_batch_size 5, as
tests/training/test_fsdp.py): a rank holds no row of the other's step and joins its
collectives with a zero-loss pass (an unchunked forward through the same wrapper).
Sampling is greedy (temperature 0.001). Measured on the 2-core test machine (torch
2.13.0+cpu): the weights gap is 6e-8 for DDP and 0.0 for FSDP2 on the uneven layout (the
gradient norms stay under the clip, and each step's rows are on one rank, so its sums run in
the same order as in one process).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ranks import launch, saved_weights

from mcgpo.cli import main
from mcgpo.training.metrics import read_metrics

GREEDY = ("--rollout.temperature", "0.001", "--eval.temperature", "0.001", "--tensorboard", "false")
UNEVEN = ("--train.mini_batch_size", "4", "--train.micro_batch_size", "5")
CHUNK = ("--train.logits_chunk", "8")  # smoke rows are longer than 8 tokens: several chunks


def _args(model: Path, out: Path, *extra: str) -> list[str]:
    return [
        "train", "--preset", "household-smoke", "--model", str(model), "--out", str(out),
        "--train.weight_decay", "0", *GREEDY, *CHUNK, *extra,
    ]  # fmt: skip


def _updates(folder: Path) -> list[dict[str, float]]:
    return [r for r in read_metrics(folder / "metrics.jsonl") if "update/rows" in r]


@pytest.mark.slow
@pytest.mark.parametrize(("sharding", "layout"), [("ddp", ()), ("fsdp2", UNEVEN)])
def test_two_ranks_with_chunked_head_train_as_one(micro_model, tmp_path, sharding, layout):
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(_args(micro_model, one, *layout)) == 0
    launch(_args(micro_model, two, *layout, "--nproc", "2", "--train.sharding", sharding))
    ra, rb = _updates(one), _updates(two)
    assert [r["update/rows"] for r in ra] == [r["update/rows"] for r in rb]
    assert [r["update/optimizer_steps"] for r in ra] == [r["update/optimizer_steps"] for r in rb]
    for a, b in zip(ra, rb):
        assert b["update/grad_norm"] == pytest.approx(a["update/grad_norm"], rel=1e-5)
    wa, wb = saved_weights(one / "model"), saved_weights(two / "model")
    start = saved_weights(micro_model)
    assert max(float((wa[k] - start[k]).abs().max()) for k in wa) > 1e-4  # it did learn
    assert wa.keys() == wb.keys()  # the saved names are the policy's, without "policy."
    gap = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
    assert gap < 1e-5
    assert "logits_chunk = 8" in (two / "config.toml").read_text()
