"""Compiled decoder layers for the update's forwards (``train.compile``; issue 33 item 2).

Regional compilation: ``torch.compile`` is applied to the *decoder layer*, not to the whole
model. One compiled function is made per layer class (its ``forward``) and bound to every
layer of that class, so each compiled graph serves all the layers of a model (28 in
Qwen2.5-1.5B), and the same compiled function the reference copy's layers (torch's dynamo
keeps its cache on the code object and, with nn modules inlined, reads each layer's
parameters as graph inputs). On one
H200 this measured 27.1 -> 37.8 % MFU for the update with fp32 master weights and bf16
autocast (``layer.compile()``, ../shared/reference/gpu-h200.md): the elementwise work
between the matrix products (RMSNorm, SiLU, RoPE, the fp32 <-> bf16 casts of autocast)
fuses into a few kernels. The embeddings, the final norm and the LM head stay eager (the head
runs on the response positions only, :mod:`mcgpo.policy.logprobs`).

Only the layer's ``forward`` is compiled, not the module call: hooks stay outside the
compiled region and run eagerly, which is what FSDP2 needs (its per-layer all-gather and
reshard are forward hooks). Gradient checkpointing (``train.gradient_checkpointing``) lives
in a different place in different transformers versions (:func:`checkpoint_layout`):

- ``"forward"`` (transformers >= 5.25): ``GradientCheckpointingLayer`` replaces each layer
  class's ``forward`` by a wrapper that checkpoints the inner forward. Dynamo cannot trace
  that checkpoint call (it broke the graph and ran the layers eagerly, torch 2.13), so the
  inner forward (the wrapper's ``__wrapped__``) is what is compiled, and an eager wrapper
  here checkpoints the compiled function as transformers would.
- ``"call"`` (transformers 5.9 to 5.24, the versions of the GPU images):
  ``GradientCheckpointingLayer.__call__`` checkpoints the whole module call, which runs the
  bound (compiled) forward: the layer's own forward is compiled and transformers'
  checkpointing stays around it, hooks included.
- ``"none"``: not a checkpointing layer; the forward is compiled as it is.

Either way each layer is checkpointed exactly once per forward (tested on the installed
transformers, and on a layer that has the 5.9 - 5.24 layout).

Shapes: the layers are compiled with dynamic shapes from the first call (``dynamic=True``),
so one graph serves every micro-batch of at least 2 rows and 2 positions, whatever its
length: row lengths need no bucketing and no padding. What still makes a new graph is a
change that dynamo guards on, each met once per process: gradients on or off (the
training forward vs the pi_old recompute and the reference), possibly train or eval mode
(the reference is in eval mode), a micro-batch with or without a padding mask (transformers
passes no mask when every row has the same length), and a micro-batch of one row (size 1
is specialised). Float attributes (the RMSNorm epsilon, the attention scale) are kept as
constants (``specialize_float``), which spares dynamo a second analysis of the first call.
:func:`compiled_graphs` counts the graphs compiled (the update logs it as
``compile/graphs``).

The compiled layers are bound only while the update's forwards run (:func:`compiled_layers`,
entered by :func:`mcgpo.policy.logprobs.token_log_probs_and_entropy`): the sampler's
one-token steps with a KV cache, generation and evaluation run the eager layers (the static
sampler compiles its own decode step). A forward's backward runs the compiled backward
whether or not the layers are still bound when it runs.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from mcgpo.update_choices import COMPILE_SETTINGS

__all__ = [
    "COMPILE_SETTINGS",
    "check_compilable",
    "checkpoint_layout",
    "compile_decoder_layers",
    "compile_enabled",
    "compile_stats",
    "compiled_graphs",
    "compiled_layers",
    "decoder_layers",
    "eager_decoder_layers",
]


# Graphs a layer class's forward may compile before dynamo runs new variants eagerly (its
# default is 8; the variants listed in the module docstring are at most 12, and the FSDP2
# subclass of a layer shares its code object).
RECOMPILE_LIMIT = 16


def compile_enabled(setting: str, device: torch.device | str) -> bool:
    """Whether ``train.compile`` = ``setting`` compiles the layers on ``device``."""
    if setting not in COMPILE_SETTINGS:
        raise ValueError(f"compile must be one of {', '.join(COMPILE_SETTINGS)}; got {setting!r}")
    if setting == "auto":
        return torch.device(device).type == "cuda"
    return setting == "true"


class _CountingInductor:
    """torch.compile's inductor backend, counting the graphs it is given."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, graph: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
        self.graphs += 1
        return torch._dynamo.lookup_backend("inductor")(graph, example_inputs)


_BACKEND = _CountingInductor()
# one compiled function per (layer class forward, dynamic): shared by every layer bound to it
_COMPILED: dict[tuple[Any, bool | None], Callable[..., Any]] = {}
_LAYERS: weakref.WeakKeyDictionary[torch.nn.Module, list[torch.nn.Module]] = (
    weakref.WeakKeyDictionary()
)


def compiled_graphs() -> int:
    """Graphs compiled so far in this process for the decoder layers (every variant of
    every layer class; the first call's graph included)."""
    return _BACKEND.graphs


def compile_stats(since: int) -> dict[str, float]:
    """The update's ``compile/*`` metrics: ``compile/graphs``, graphs compiled since
    ``since`` (a :func:`compiled_graphs` reading taken when the update began; 0 once every
    variant has been met), and ``compile/graphs_total``, since the process started."""
    now = compiled_graphs()
    return {"compile/graphs": float(now - since), "compile/graphs_total": float(now)}


def check_compilable(model: torch.nn.Module, device: torch.device | str) -> None:
    """Raise ValueError (one line) when ``model``'s layers cannot be compiled on ``device``:
    no decoder layers to find (:func:`decoder_layers`), or, on the CPU, no C++ compiler for
    inductor's CPU code (it would fail at the first forward, deep inside the update)."""
    if not decoder_layers(model):
        raise ValueError(
            f"{type(model).__name__} has no decoder layers to compile (none of its modules "
            "is named in a _no_split_modules list)"
        )
    if torch.device(device).type == "cpu":
        from torch._inductor.cpp_builder import get_cpp_compiler

        try:
            get_cpp_compiler()
        except Exception as err:  # inductor's InvalidCxxCompiler, or its search failing
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ValueError(f"inductor finds no C++ compiler for the CPU ({first})") from None


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers of ``model`` (a Hugging Face policy, or a wrapper of one: DDP,
    :class:`~mcgpo.policy.logprobs.PolicyForward`, FSDP2): the outermost modules whose class,
    or a base class (FSDP2 subclasses each layer), is named in the model's
    ``_no_split_modules`` (``Qwen2DecoderLayer`` for Qwen2), in module order."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    found: list[torch.nn.Module] = []
    inside: set[str] = set()  # prefixes of layers already found (their blocks are theirs)
    for name, module in model.named_modules():
        if any(name.startswith(p + ".") for p in inside):
            continue
        if any(cls.__name__ in names for cls in type(module).__mro__):
            found.append(module)
            inside.add(name)
    return found


def _settings() -> contextlib.AbstractContextManager[Any]:
    return torch._dynamo.config.patch(specialize_float=True, recompile_limit=RECOMPILE_LIMIT)


def _call(compiled: Callable[..., Any], layer: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    with _settings():
        return compiled(layer, *args, **kwargs)


def _call_checkpointed(
    compiled: Callable[..., Any], layer: torch.nn.Module, *args: Any, **kwargs: Any
) -> Any:
    """transformers' ``forward_with_checkpointing`` around the compiled inner forward: the
    layer is checkpointed when gradient checkpointing is on (for the "call" layout: as it
    was when the layer was bound, :func:`_bind`), it trains and gradients are on (the
    update's forwards pass no KV cache, so none is to be dropped here). The checkpoint holds
    the compiled function itself, so the backward's recomputation runs it too, also after
    the layers are unbound (:func:`compiled_layers`)."""
    on = layer.__dict__.get(_HELD, layer.gradient_checkpointing)
    if on and layer.training and torch.is_grad_enabled():
        inner = functools.partial(_call, compiled, layer, **kwargs)
        return layer._gradient_checkpointing_func(inner, *args)
    return _call(compiled, layer, *args, **kwargs)


# "call" layout: the layer's gradient_checkpointing while it is bound (transformers' own
# __call__ then sees False and leaves the checkpointing to _call_checkpointed)
_HELD = "_mcgpo_gradient_checkpointing"


def checkpoint_layout(layer: torch.nn.Module) -> str:
    """Where ``layer``'s class checkpoints when gradient checkpointing is on (module
    docstring): ``"forward"`` (the class ``forward`` is transformers' checkpointing wrapper),
    ``"call"`` (its ``__call__`` checkpoints the module call) or ``"none"``."""
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:  # an older transformers: the forward is the layer's own
        return "none"
    if not isinstance(layer, GradientCheckpointingLayer):
        return "none"
    # the version's layout, read off the base class (a layer's forward may carry other
    # decorators' __wrapped__ in any version)
    if "__call__" in vars(GradientCheckpointingLayer):
        return "call"
    if "__init_subclass__" in vars(GradientCheckpointingLayer) and hasattr(
        type(layer).forward, "__wrapped__"
    ):
        return "forward"
    return "none"


def _bind(layer: torch.nn.Module, dynamic: bool | None) -> None:
    layout = checkpoint_layout(layer)
    forward = type(layer).forward.__wrapped__ if layout == "forward" else type(layer).forward
    compiled = _COMPILED.get((forward, dynamic))
    if compiled is None:
        compiled = torch.compile(forward, backend=_BACKEND, dynamic=dynamic)
        _COMPILED[(forward, dynamic)] = compiled
    # a partial, not a closure: a deep copy of the model binds the copy to the copied layer
    if layout == "call":
        # transformers' __call__ would checkpoint the module call, and its recomputation in
        # the backward would run the forward bound then: the eager one once the layers are
        # unbound, whose saved tensors are not the compiled function's (CheckpointError,
        # torch 2.13); the checkpoint moves into the bound forward, as in the "forward" layout
        layer.__dict__[_HELD] = bool(layer.gradient_checkpointing)
        layer.gradient_checkpointing = False
    checkpointed = layout != "none"
    layer.forward = functools.partial(
        _call_checkpointed if checkpointed else _call, compiled, layer
    )


def _unbind(layer: torch.nn.Module) -> None:
    """The layer's class forward again (and its own gradient checkpointing, "call" layout)."""
    del layer.forward
    if _HELD in layer.__dict__:
        layer.gradient_checkpointing = layer.__dict__.pop(_HELD)


def _is_bound(layer: torch.nn.Module) -> bool:
    bound = layer.__dict__.get("forward")
    return isinstance(bound, functools.partial) and bound.func in (_call, _call_checkpointed)


def compile_decoder_layers(model: torch.nn.Module, *, dynamic: bool | None = True) -> int:
    """Compile every decoder layer of ``model`` (:func:`decoder_layers`) for good; returns
    how many were bound. Compilation itself happens at the first forward (seconds to a
    minute); all layers of a class share one compiled function. ``dynamic``: torch.compile's
    (True: one graph for all row counts >= 2 and lengths >= 2; None: static first, dynamic
    on the first change; False: one graph per shape). Undo with :func:`eager_decoder_layers`.
    Raises ValueError when ``model`` has no decoder layers that can be found."""
    layers = decoder_layers(model)
    if not layers:
        raise ValueError(
            f"{type(model).__name__} has no decoder layers to compile (none of its modules "
            "is named in a _no_split_modules list)"
        )
    for layer in layers:
        _bind(layer, dynamic)
    return len(layers)


def eager_decoder_layers(model: torch.nn.Module) -> int:
    """Undo :func:`compile_decoder_layers`: the layers run their class's eager forward
    again; returns how many were unbound."""
    count = 0
    for layer in decoder_layers(model):
        if _is_bound(layer):
            _unbind(layer)
            count += 1
    return count


@contextlib.contextmanager
def compiled_layers(model: Any, enabled: bool = True) -> Iterator[int]:
    """While the block runs, ``model``'s decoder layers run compiled (:func:`_bind`, the
    shared dynamic-shape function); afterwards they are eager again. Layers that are
    already compiled (nested use, or :func:`compile_decoder_layers`) are left as they are.
    Yields the number of layers this call bound (0 when ``enabled`` is false)."""
    if not enabled:
        yield 0
        return
    layers = _LAYERS.get(model)
    if layers is None:
        layers = decoder_layers(model)
        _LAYERS[model] = layers
    bound = [layer for layer in layers if not _is_bound(layer)]
    for layer in bound:
        _bind(layer, True)
    try:
        yield len(bound)
    finally:
        for layer in bound:
            _unbind(layer)
