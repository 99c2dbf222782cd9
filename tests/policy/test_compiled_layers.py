"""Compiled decoder layers (train.compile): found through wrappers, bound only while asked,
and the compiled update forward equals the eager one (loss, log-probs, every gradient)."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mcgpo.policy.compile import (
    check_compilable,
    compile_decoder_layers,
    compile_enabled,
    compile_stats,
    compiled_graphs,
    compiled_layers,
    decoder_layers,
    eager_decoder_layers,
)
from mcgpo.policy.logprobs import PolicyForward, token_log_probs_and_entropy


def qwen2(layers: int = 2) -> torch.nn.Module:
    """A GQA Qwen2 (4 query heads over 2 KV heads), width 32, vocabulary 64, float32."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=True,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def test_auto_compiles_on_cuda_only_and_a_bad_setting_is_named():
    assert compile_enabled("auto", "cuda:0") and not compile_enabled("auto", "cpu")
    assert compile_enabled("true", "cpu") and not compile_enabled("false", "cuda")
    with pytest.raises(ValueError, match="compile must be one of auto, true, false; got 'yes'"):
        compile_enabled("yes", "cpu")


def test_layers_are_found_through_wrappers_and_bound_only_while_asked():
    model = qwen2(layers=3)
    layers = list(model.model.layers)
    assert decoder_layers(model) == layers
    assert decoder_layers(PolicyForward(model)) == layers  # what DDP and FSDP2 wrap
    with compiled_layers(model) as bound:
        assert bound == 3 and all("forward" in layer.__dict__ for layer in layers)
        with compiled_layers(PolicyForward(model)) as again:  # nested: already compiled
            assert again == 0
        # one compiled function serves every layer: the same callable, bound to each layer
        functions = {layer.forward.args[0] for layer in layers}
        assert len(functions) == 1 and [la.forward.args[1] for la in layers] == layers
    assert not any("forward" in layer.__dict__ for layer in layers)  # eager again
    with compiled_layers(model, enabled=False) as bound:
        assert bound == 0 and not any("forward" in layer.__dict__ for layer in layers)


def test_compiling_for_good_survives_a_deep_copy_and_can_be_undone():
    model = qwen2()
    assert compile_decoder_layers(model) == 2
    twin = copy.deepcopy(model)  # e.g. the frozen reference: its layers must call themselves
    for layer, copied in zip(model.model.layers, twin.model.layers, strict=True):
        assert isinstance(copied.forward, functools.partial) and copied.forward.args[1] is copied
        assert copied.forward.args[0] is layer.forward.args[0]  # still one compiled function
    assert eager_decoder_layers(model) == 2 and eager_decoder_layers(model) == 0
    assert "forward" not in model.model.layers[0].__dict__


def test_a_model_without_decoder_layers_is_refused_in_one_line():
    with pytest.raises(ValueError, match="Linear has no decoder layers to compile"):
        compile_decoder_layers(torch.nn.Linear(2, 2))


def test_a_model_that_cannot_compile_is_named_before_any_forward():
    with pytest.raises(ValueError, match="Linear has no decoder layers to compile"):
        check_compilable(torch.nn.Linear(2, 2), "cpu")
    model = qwen2()
    assert check_compilable(model, "cpu") is None  # g++ here
    # inductor's CPU code needs a C++ compiler: none found is one line, not a failure deep
    # inside the first update
    with (
        torch._inductor.config.patch({"cpp.cxx": (None, "mcgpo-no-such-c++")}),
        pytest.raises(ValueError, match=r"^inductor finds no C\+\+ compiler for the CPU \("),
    ):
        check_compilable(model, "cpu")
    assert check_compilable(model, "cuda") is None  # CUDA compiles Triton, not C++


def test_compile_stats_count_graphs_since_a_reading():
    now = compiled_graphs()
    assert compile_stats(now) == {"compile/graphs": 0.0, "compile/graphs_total": float(now)}


def _loss_and_grads(model, ids, mask, positions, compiled: bool):
    """A loss of the update's kind on the response positions: log-probs and entropies
    weighted by fixed per-token factors (an advantage's role), and every gradient."""
    model.zero_grad(set_to_none=True)
    log_probs, entropy = token_log_probs_and_entropy(
        model, ids, mask, positions=positions, compile_layers=compiled
    )
    weight = torch.linspace(-1.0, 1.0, ids.shape[1])
    loss = -(weight * log_probs).sum() / positions.sum() - 0.1 * entropy.sum() / positions.sum()
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return loss.detach(), log_probs.detach(), entropy.detach(), grads


def _rows(rows: int, length: int, seed: int):
    """Right-padded rows of random tokens (row r has ``length - 2r`` real tokens) and a
    response mask on their last 4 real tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 64, (rows, length), generator=g)
    real = length - 2 * torch.arange(rows)
    col = torch.arange(length)
    mask = (col < real[:, None]).long()
    positions = (col >= real[:, None] - 4) & mask.bool()
    return ids, mask, positions


@pytest.mark.slow  # one compilation of a layer's forward and backward: 20-60 s on 2 busy cores
def test_compiled_layers_equal_eager_loss_log_probs_and_gradients():
    """Tolerance, derived: both paths evaluate the same float32 maths and differ only in the
    order of operations that inductor fuses or reassociates. By the standard bound on
    float32 sums (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., eq. 3.4 /
    Lemma 3.1: a sum or dot product of n terms carries a relative error of at most
    gamma_n ~ n u, u = 2^-24 = 6.0e-8), each evaluation of an operation whose longest
    reduction has n <= 64 terms (the MLP width and the vocabulary; hidden 32, rows of at most
    12 positions) is off by at most 64 u relative to its scale. The forward chains about 25
    such operations (per layer: 2 RMSNorms, q/k/v/o, RoPE, scores, softmax, weighted sum,
    gate/up/down, 2 residual adds; 2 layers, final norm, head, log-softmax) and the backward
    about as many again, so the two evaluations differ by at most 2 x 50 x 64 u = 3.8e-4 of
    the scale of the terms in the worst case; measured on this model: about 1e-6 of it.
    The asserted bound is that worst case, the scale taken as the largest magnitude of the
    tensor (loss, log-probs, entropies) or of the whole gradient (a gradient can cancel to
    about 0, e.g. a query weight's when every row attends to one key, and keeps rounding
    noise of the size of its terms)."""
    model = qwen2()
    ids, mask, positions = _rows(3, 12, seed=0)
    ran: list[str] = []  # what produced layer 0's output: the compiled function or eager ops
    model.model.layers[0].register_forward_hook(
        lambda module, args, out: ran.append(type(out.grad_fn).__name__)
    )
    eager = _loss_and_grads(model, ids, mask, positions, compiled=False)
    before = compiled_graphs()
    compiled = _loss_and_grads(model, ids, mask, positions, compiled=True)
    _assert_close(eager, compiled)
    assert ran == ["AddBackward0", "CompiledFunctionBackward"]
    # one graph (forward and backward of a layer) served both layers; micro-batches of other
    # row counts and lengths reuse it: no compilation per micro-batch
    first = compiled_graphs() - before
    assert first == 1
    for rows, length, seed in [(4, 20, 1), (2, 9, 2), (5, 31, 3)]:
        _loss_and_grads(model, *_rows(rows, length, seed), compiled=True)
    assert compiled_graphs() - before == first
    assert not any("forward" in layer.__dict__ for layer in model.model.layers)
    # train.gradient_checkpointing: the compiled inner forward under transformers'
    # checkpoint (non-reentrant), run by the eager wrapper: as close, and compiled indeed
    model.gradient_checkpointing_enable()
    ran.clear()
    eager = _loss_and_grads(model, ids, mask, positions, compiled=False)
    compiled = _loss_and_grads(model, ids, mask, positions, compiled=True)
    _assert_close(eager, compiled)
    assert ran[0] != "CompiledFunctionBackward" and ran[1] == "CompiledFunctionBackward"


def _assert_close(eager, compiled, reached: bool = True) -> None:
    """Loss, log-probs, entropies and every gradient within the bound derived above."""
    bound = 2 * 50 * 64 * 2.0**-24
    for name, e, c in [("loss", eager[0], compiled[0]), ("log_probs", eager[1], compiled[1]),
                       ("entropy", eager[2], compiled[2])]:  # fmt: skip
        assert float((c - e).abs().max()) <= bound * float(e.abs().max()), name
    assert eager[3].keys() == compiled[3].keys()
    scale = max(float(e.abs().max()) for e in eager[3].values())
    for name, e in eager[3].items():
        gap = float((compiled[3][name] - e).abs().max())
        assert gap <= bound * scale, (name, gap)
    if reached:  # every weight gets a gradient (a random batch may miss embedding rows)
        assert all(float(g.abs().max()) > 0 for g in eager[3].values())


@pytest.mark.slow  # compiles at most the one graph of the test above (shared in a session)
@settings(max_examples=8, deadline=None)
@given(
    rows=st.integers(2, 6),
    length=st.integers(3, 40),
    cut=st.lists(st.integers(0, 39), min_size=6, max_size=6),
    seed=st.integers(0, 2**16),
)
def test_any_micro_batch_shape_runs_the_same_graph_as_eager(rows, length, cut, seed):
    """Property: for any micro-batch of >= 2 rows and >= 2 positions, right-padded at random
    lengths (at least 2 real tokens a row, one row padded) with a random span of positions
    read (the second half of each row's real tokens), the compiled layers
    give the eager loss, log-probs, entropies and gradients within the bound derived above,
    and, after the first graph, compile nothing new."""
    model = _MODEL.setdefault("qwen2", qwen2())
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 64, (rows, length), generator=g)
    real = torch.tensor([length - c % (length - 1) for c in cut[:rows]])  # 2 .. length
    real[-1] = min(int(real[-1]), length - 1)  # one padded row: a padding mask (see module)
    col = torch.arange(length)
    mask = (col < real[:, None]).long()
    positions = (col >= real[:, None] // 2) & mask.bool()
    eager = _loss_and_grads(model, ids, mask, positions, compiled=False)
    before = compiled_graphs()
    compiled = _loss_and_grads(model, ids, mask, positions, compiled=True)
    _assert_close(eager, compiled, reached=False)
    if "compiled" in _MODEL:  # the first example may compile the graph; no later one does
        assert compiled_graphs() == before
    _MODEL["compiled"] = True


_MODEL: dict[str, object] = {}


def _count_checkpoints(model) -> list[int]:
    """Each call of a layer's checkpoint function appends 1 to the returned list."""
    calls: list[int] = []
    for layer in model.model.layers:
        run = layer._gradient_checkpointing_func

        def counted(fn, *args, run=run, **kwargs):
            calls.append(1)
            return run(fn, *args, **kwargs)

        layer._gradient_checkpointing_func = counted
    return calls


def _old_checkpoint_layout(monkeypatch) -> None:
    """transformers 5.9 - 5.24's layout on the installed one: the layer class's forward is
    its own, and GradientCheckpointingLayer.__call__ checkpoints the module call."""
    from transformers.modeling_layers import GradientCheckpointingLayer
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

    def checkpointed_call(self, *args, **kwargs):  # transformers 5.17's __call__, in short
        if self.gradient_checkpointing and self.training:
            call = functools.partial(torch.nn.Module.__call__, self, **kwargs)
            return self._gradient_checkpointing_func(call, *args)
        return torch.nn.Module.__call__(self, *args, **kwargs)

    monkeypatch.setattr(Qwen2DecoderLayer, "forward", Qwen2DecoderLayer.forward.__wrapped__)
    monkeypatch.setattr(GradientCheckpointingLayer, "__call__", checkpointed_call, raising=False)


@pytest.mark.slow  # compiles the layer graph of the test above (shared in a session)
@pytest.mark.parametrize("layout", ["installed", "5.9-5.24"])
def test_checkpointing_is_found_and_runs_once_per_layer_around_the_compiled_forward(
    monkeypatch, layout
):
    """Issue 43 item 6: gradient checkpointing with compiled layers, in both places
    transformers puts it: each layer is checkpointed exactly once per forward (0: the
    detection missed it; 2: both transformers and mcgpo checkpointed), and the loss,
    log-probs and gradients equal the eager model's within the bound derived above."""
    from mcgpo.policy.compile import checkpoint_layout

    if layout != "installed":
        _old_checkpoint_layout(monkeypatch)
    model = qwen2()
    model.gradient_checkpointing_enable()
    expected = "call" if layout != "installed" else "forward"
    assert {checkpoint_layout(layer) for layer in model.model.layers} == {expected}
    calls = _count_checkpoints(model)
    ids, mask, positions = _rows(3, 12, seed=0)
    eager = _loss_and_grads(model, ids, mask, positions, compiled=False)
    assert len(calls) == 2  # one per layer
    calls.clear()
    compiled = _loss_and_grads(model, ids, mask, positions, compiled=True)
    assert len(calls) == 2
    _assert_close(eager, compiled)
    assert checkpoint_layout(torch.nn.Linear(2, 2)) == "none"
