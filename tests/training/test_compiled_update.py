"""``--train.compile``: a bad value is one line and exit 2; a household-smoke run with
compiled decoder layers trains as the eager run does and counts its compilations."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file

from mcgpo.cli import main
from mcgpo.training.config import ConfigError, TrainConfig
from mcgpo.training.metrics import read_metrics


def test_a_bad_compile_value_is_one_line_exit_2(tmp_path, smoke_args, capsys):
    assert main(smoke_args(tmp_path / "run", "--train.compile", "yes")) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "train.compile must be one of auto, true, false; got 'yes'" in err
    with pytest.raises(ConfigError, match=r"train\.compile must be one of"):
        TrainConfig(compile="cuda").check()


def test_no_cpp_compiler_for_compiled_layers_on_the_cpu_is_one_line_exit_2(
    tmp_path, smoke_args, capsys
):
    with torch._inductor.config.patch({"cpp.cxx": (None, "mcgpo-no-such-c++")}):
        assert main(smoke_args(tmp_path / "run", "--train.compile", "true")) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "train.compile true: inductor finds no C++ compiler for the CPU (" in err
    assert err.endswith("; use --train.compile false")
    # auto on the CPU does not compile: no compiler needed
    assert main(smoke_args(tmp_path / "auto", "--train.updates", "0", "--eval.every", "0")) == 0


def _updates(folder):
    return [r for r in read_metrics(folder / "metrics.jsonl") if "loss/task" in r]


def _gap(a, b) -> float:
    a, b = (load_file(str(f / "model" / "model.safetensors")) for f in (a, b))
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.slow  # compiles the micro policy's layer (train, and the reference's eval pass)
def test_household_smoke_with_compiled_layers_trains_as_the_eager_run(smoke_args, tmp_path):
    eager, compiled = tmp_path / "eager", tmp_path / "compiled"
    assert main(smoke_args(eager, "--train.compile", "false")) == 0
    assert main(smoke_args(compiled, "--train.compile", "true")) == 0
    first, second = _updates(compiled)
    for record in (first, second):
        for key, value in record.items():
            if key.startswith("loss/"):
                assert math.isfinite(value), (key, value)
    # compilations counted per update; a graph per variant (gradients on / off, train / eval
    # mode, padding mask or none, one-row micro-batches: at most 8 here), not per micro-batch
    # (graphs_total counts the whole process: under pytest-xdist a test that ran before in the
    # same worker may have compiled graphs of its own, so the totals are compared as deltas)
    assert first["compile/graphs"] >= 1
    assert (
        second["compile/graphs_total"] == first["compile/graphs_total"] + second["compile/graphs"]
    )
    assert first["compile/graphs"] + second["compile/graphs"] <= 8
    assert "compile/graphs" not in _updates(eager)[0]
    # update 1 runs on the same rollouts (the sampler is eager): its losses equal the eager
    # run's to float32 rounding (bound derived in tests/policy/test_compiled_layers.py: 3.8e-4 of
    # the scale); the weights after two AdamW steps (lr 1e-3) differ by rounding only
    for key in ("loss/task", "loss/policy", "loss/kl", "policy/entropy"):
        e = _updates(eager)[0][key]
        assert abs(first[key] - e) <= 3.8e-4 * max(abs(e), 1e-3), key
    assert _gap(eager, compiled) <= 1e-5  # measured 8.6e-7 (torch 2.13.0+cpu)


@pytest.mark.slow  # compiles the training forward and the no-grad pi_old recompute
def test_compiled_pi_old_recompute_gives_a_ratio_of_exactly_1_at_theta_old(smoke_args, tmp_path):
    """bf16-mixed with pi_old recomputed (train.old_logprobs): the recompute runs the
    compiled layers without gradients, the training forward with them: two graphs. At the
    first optimiser step (theta = theta_old) every ratio is still exactly 1 and MCGPO's pair
    score d exactly 0, as with eager layers (measured: the two graphs compute the forward
    alike, torch 2.13.0+cpu). The compiled forward is not the eager sampler's, which is
    what the recompute is for (pi_old/max_abs_diff about 1e-3 here, bf16 rounding)."""
    out = tmp_path / "run"
    extra = ("--train.compile", "true", "--train.old_logprobs", "recompute")
    extra = (*extra, "--train.precision", "bf16-mixed", "--train.updates", "1")
    assert main(smoke_args(out, *extra, "--eval.every", "0")) == 0
    (record,) = _updates(out)
    assert record["pi_old/recomputed"] == 1.0
    assert record["pi_old/ratio_max_dev_at_old"] == 0.0
    assert record["pairs/d_spread_at_old"] == 0.0
    assert record["loss/kl"] == 0.0  # the compiled reference forward, theta_0 = the policy
    assert 2 <= record["compile/graphs"] <= 12


GREEDY = ("--rollout.temperature", "0.001", "--eval.temperature", "0.001", "--tensorboard", "false")


@pytest.mark.slow  # each rank compiles the layer itself: minutes on 2 busy cores
@pytest.mark.parametrize("sharding", ["ddp", "fsdp2"])
def test_two_processes_with_compiled_layers_train_as_one_eager_process(
    tmp_path, smoke_args, sharding
):
    """DDP (the layers of the policy DDP wraps) and FSDP2 (the sharded copy's layers, its
    all-gather hooks eager around the compiled forward) with compiled layers, against the
    single eager process, the reference: the final weights within 1e-5 (as
    tests/training/test_distributed.py bounds its eager run; measured with torch
    2.13.0+cpu: FSDP2 compiled 3.3e-6 from the eager process, one compiled process 8.6e-7,
    eager FSDP2 6e-8 in test_fsdp.py: rounding, which Adam's first steps scale by about
    lr / |g| where a gradient is small). kl_coef 0 (no reference forward) halves
    the compilations; the reference's compiled pass is run by the smoke test above."""
    from ranks import launch, saved_weights

    extra = (*GREEDY, "--train.kl_coef", "0")
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(smoke_args(one, *extra, "--train.compile", "false")) == 0
    launch(
        smoke_args(two, *extra, "--train.compile", "true", "--nproc", "2",
                   "--train.sharding", sharding),
        timeout=1800,
    )  # fmt: skip
    first = _updates(two)[0]
    assert first["compile/graphs"] >= 1 and first["compile/graphs_total"] <= 8
    wa, wb = saved_weights(one / "model"), saved_weights(two / "model")
    assert wa.keys() == wb.keys()
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-5
