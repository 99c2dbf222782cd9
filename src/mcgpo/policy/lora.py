"""LoRA adapters on any policy mcgpo loads, through PEFT: wrap, reference, save, merge.

:func:`add_lora` injects PEFT's LoRA layers in place (``peft.inject_adapter_in_model``): the
model keeps its own class (``Qwen2ForCausalLM`` …), so everything that reads it (the
log-prob paths' ``model.base_model`` and head, gradient checkpointing, compiled layers, DDP)
works unchanged; the base weights are frozen and only the adapters train. Each adapted
linear layer computes ``W x + (alpha / r) B A x`` with ``A`` random (Kaiming-uniform, PEFT's
default, drawn under a forked RNG seeded by the run's seed, so the caller's RNG is
untouched) and ``B = 0``: the first forward equals the base model's exactly (tested).
The adapters are float32 whatever the base's dtype (PEFT's ``get_peft_model`` default,
``autocast_adapter_dtype``): with ``train.precision bf16`` the frozen base is bf16 (2 bytes
a parameter) while the adapters and their AdamW moments stay float32, so the small LoRA
updates are not rounded away on a bf16 grid.

The KL reference is the same weights with the adapters switched off (:class:`AdaptersOff`,
read through :func:`reference_forward`): ``W x`` exactly, the initial policy, with no
second copy of the model (the memory plan counts it so). LoRA dropout, when set, acts on
the adapters' input only, in train mode: with the adapters off it has no effect, the
samplers run the model in eval mode, and pi_old's recompute turns it off
(:func:`adapter_dropout_off`); only the update's own forward draws it.

The adapter folder is PEFT's format: ``adapter_config.json`` (the LoRA options and
``base_model_name_or_path``, the base model's folder) and ``adapter_model.safetensors``
(keys ``base_model.model.<module>.lora_A.weight`` …), plus the tokenizer; PEFT's
``PeftModel.from_pretrained(base, folder)`` loads it, and so does
:func:`mcgpo.policy.load_policy` (merged, a plain model). :func:`merged_parameters` gives the
merged weights ``W + (alpha / r) B A`` under the base model's names, one at a time (what a
vLLM engine syncs); :func:`merged_model` a plain model with those weights (the merged
folder any tool loads).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mcgpo.model_names import ADAPTER_CONFIG, is_adapter_folder

__all__ = [
    "ADAPTER_CONFIG",
    "AdaptersOff",
    "LoraError",
    "adapter_dropout_off",
    "adapter_state",
    "add_lora",
    "has_lora",
    "is_adapter_folder",
    "load_adapter_state",
    "merged_model",
    "merged_parameters",
    "non_linear_adapters",
    "reference_forward",
    "save_adapter",
    "trainable_count",
]

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER = "default"  # PEFT's adapter name; one adapter per policy


class LoraError(ValueError):
    """The model cannot be wrapped as asked; the message is one line."""


def add_lora(
    model: Any,
    *,
    rank: int,
    alpha: float,
    dropout: float,
    targets: str,
    seed: int,
    base_path: str | None = None,
) -> Any:
    """Inject LoRA adapters into ``model`` in place and freeze its base weights; returns it.

    ``targets``: comma-separated module names (suffixes, as PEFT matches them) or
    ``all-linear`` (``train.lora_targets``; its default: the attention and MLP
    projections). ``seed`` draws the ``A`` matrices. ``base_path``: the base model's folder, written into the adapter
    folder's ``adapter_config.json``. Raises :class:`LoraError` when no module matches or
    PEFT cannot wrap a matched module.
    """
    from peft import LoraConfig, inject_adapter_in_model
    from peft.tuners.tuners_utils import cast_adapter_dtype

    if rank < 1:
        raise LoraError(f"LoRA rank must be >= 1, got {rank}")
    names = [t.strip() for t in targets.split(",") if t.strip()]
    if not names:
        raise LoraError("LoRA targets are empty")
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=names[0] if names == ["all-linear"] else names,
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_path,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            inject_adapter_in_model(config, model, adapter_name=ADAPTER)
            cast_adapter_dtype(model, ADAPTER)  # float32 adapters on a bf16 base, as PEFT's
        except (ValueError, TypeError, KeyError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise LoraError(f"PEFT cannot wrap {type(model).__name__}: {first}") from None
    model._mcgpo_lora_config = config  # what save_adapter writes
    return model


def has_lora(model: Any) -> bool:
    """Whether ``model`` carries adapters injected by :func:`add_lora`."""
    return getattr(model, "_mcgpo_lora_config", None) is not None


def trainable_count(model: Any) -> int:
    """Parameters that train (the adapters' with LoRA, all of them without)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _tuner_layers(model: Any) -> Iterator[tuple[str, Any]]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    for name, module in model.named_modules():
        if isinstance(module, BaseTunerLayer):
            yield name, module


@dataclass(frozen=True)
class AdaptersOff:
    """The KL reference of a LoRA policy: ``policy`` with its adapters switched off (the
    base model, i.e. the initial policy) — the same weights, not a copy."""

    policy: Any


@contextmanager
def reference_forward(reference: Any) -> Iterator[Any]:
    """The module to run the reference forward on: ``reference`` itself (a frozen copy), or
    for :class:`AdaptersOff` its policy with the adapters disabled until the block ends."""
    if not isinstance(reference, AdaptersOff):
        yield reference
        return
    layers = [module for _, module in _tuner_layers(reference.policy)]
    for module in layers:
        module.enable_adapters(False)
    try:
        yield reference.policy
    finally:
        for module in layers:
            module.enable_adapters(True)


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` whole: an FSDP2 shard (DTensor) all-gathered (a collective), else itself."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


@contextmanager
def adapter_dropout_off(model: Any) -> Iterator[None]:
    """``model``'s adapter dropout (``train.lora_dropout``) off until the block ends: its
    dropout modules in eval mode, the rest of the model left as it is. What pi_old's
    recompute runs under, so that pi_old is the policy the sampler played (in eval mode),
    not one random dropout draw of it. No-op without adapters or dropout."""
    drops = [
        module.lora_dropout[ADAPTER]
        for _, module in _tuner_layers(model)
        if ADAPTER in getattr(module, "lora_dropout", {})
    ]
    modes = [drop.training for drop in drops]
    for drop in drops:
        drop.eval()
    try:
        yield
    finally:
        for drop, mode in zip(drops, modes, strict=True):
            drop.train(mode)


def adapter_state(model: Any) -> dict[str, torch.Tensor]:
    """The adapters' weights by PEFT's names (``<module>.lora_A.weight`` …), on the CPU,
    whole: with the policy sharded in place (FSDP2) each is all-gathered, so this is then a
    collective (every rank calls it and gets them all)."""
    from peft import get_peft_model_state_dict

    state = get_peft_model_state_dict(model, adapter_name=ADAPTER)
    return {k: _whole(v.detach()).cpu().contiguous() for k, v in state.items()}


def save_adapter(
    model: Any, tokenizer: Any, path: str | Path, state: dict[str, torch.Tensor] | None = None
) -> Path:
    """Write ``model``'s adapters as a PEFT adapter folder (module docstring), and the
    tokenizer; returns the folder. ``state``: the adapters' weights already gathered
    (:func:`adapter_state`, a sharded policy's), else read from ``model``."""
    from safetensors.torch import save_file

    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    model._mcgpo_lora_config.save_pretrained(str(folder))
    state = adapter_state(model) if state is None else state
    weights = {f"base_model.model.{k}": v for k, v in state.items()}
    save_file(weights, str(folder / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return folder


def adapter_base(path: str | Path) -> str | None:
    """The base model's folder named by an adapter folder's config (None if unnamed)."""
    config = json.loads((Path(path) / ADAPTER_CONFIG).read_text())
    return config.get("base_model_name_or_path") or None


def load_adapter_state(model: Any, path: str | Path) -> None:
    """Set ``model``'s adapters (:func:`add_lora` with the same options) from an adapter
    folder written by :func:`save_adapter`; every adapter weight must be there."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    prefix = "base_model.model."
    saved = load_file(str(Path(path) / ADAPTER_WEIGHTS))
    state = {k.removeprefix(prefix): v for k, v in saved.items()}
    expected = set(adapter_state(model))
    if set(state) != expected:
        missing = sorted(expected - set(state))[:1] or sorted(set(state) - expected)[:1]
        raise LoraError(
            f"adapter folder {str(path)!r} does not match the policy's adapters ({missing[0]})"
        )
    result = set_peft_model_state_dict(model, state, adapter_name=ADAPTER)
    unexpected = getattr(result, "unexpected_keys", None)
    if unexpected:
        raise LoraError(f"adapter folder {str(path)!r}: unexpected weight {unexpected[0]}")


def non_linear_adapters(model: Any) -> list[str]:
    """The adapted modules of ``model`` that are not linear layers (an embedding …): their
    merged weights cannot be computed from FSDP2 shards (:func:`merged_parameters`)."""
    from peft.tuners.lora import Linear

    return [name for name, module in _tuner_layers(model) if not isinstance(module, Linear)]


def _delta(module: Any) -> torch.Tensor:
    """``(alpha / r) B A`` of one adapted layer, in its base weight's shape. PEFT's own
    ``get_delta_weight``; for a layer whose adapters are FSDP2 shards (the policy sharded
    in place) ``A`` and ``B`` are all-gathered first (a collective) and the product is the
    same formula, PEFT's for a linear layer (``transpose(B A, fan_in_fan_out) * scaling``)."""
    from peft.tuners.lora import Linear
    from peft.utils.other import transpose
    from torch.distributed.tensor import DTensor

    a, b = module.lora_A[ADAPTER].weight, module.lora_B[ADAPTER].weight
    if not isinstance(a, DTensor):
        return module.get_delta_weight(ADAPTER)
    if not isinstance(module, Linear):
        raise LoraError(
            f"merging sharded adapters of {type(module).__name__} layers is not supported "
            "(linear layers only); use train.fsdp_replica true"
        )
    product = transpose(_whole(b) @ _whole(a), module.fan_in_fan_out)
    return product * module.scaling[ADAPTER]


def merged_parameters(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """``model``'s parameters under the base model's names, whole and detached, the
    adapted layers' weights merged (``W + (alpha / r) B A``): what the base model class
    loads. Without adapters, ``named_parameters`` as it is. One merged tensor at a time.
    With the policy sharded in place (FSDP2) each is all-gathered first: a collective,
    every rank iterates to the end in the same order."""
    if not has_lora(model):
        for name, param in model.named_parameters():
            yield name, param.detach()
        return
    adapted = dict(_tuner_layers(model))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_" in name:
                continue
            owner, _, leaf = name.rpartition(".")
            base = owner.removesuffix(".base_layer")
            if owner.endswith(".base_layer") and base in adapted and leaf == "weight":
                module = adapted[base]
                whole = _whole(param)
                yield f"{base}.weight", (whole + _delta(module).to(whole.dtype)).detach()
            else:
                yield name.replace(".base_layer.", "."), _whole(param).detach()


def merged_model(model: Any) -> Any:
    """A plain copy of ``model`` (its own class, no adapter layers) whose weights are the
    merged ones (:func:`merged_parameters`); ``model`` itself is unchanged."""
    plain = copy.deepcopy(model)
    with torch.no_grad():
        for name, module in list(_tuner_layers(plain)):
            module.merge(adapter_names=[ADAPTER])
            parent_name, _, child = name.rpartition(".")
            parent = plain.get_submodule(parent_name) if parent_name else plain
            setattr(parent, child, module.get_base_layer())
    if hasattr(plain, "_mcgpo_lora_config"):
        del plain._mcgpo_lora_config
    plain.requires_grad_(True)
    return plain
