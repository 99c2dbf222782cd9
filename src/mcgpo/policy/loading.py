"""Load any Hugging Face causal LM and its tokenizer from a local folder, offline; save one.

``load_policy`` never touches the network (``local_files_only=True``): a missing folder, or
one without ``config.json``, is a :class:`PolicyLoadError` with a one-line message. Weights
are written as safetensors by ``save_policy``.

A tokenizer saved as a plain fast tokenizer (``tokenizer_class`` ``TokenizersBackend`` or
``PreTrainedTokenizerFast``, as the tiny model's is) is loaded as exactly that: ``AutoTokenizer``
would pick the model type's own class (``Qwen2Tokenizer``), which rebuilds the pre-tokenizer
and changes the tokenization.

Attention runs through transformers' default implementation, which is SDPA
(``torch.nn.functional.scaled_dot_product_attention``: flash / memory-efficient kernels on
CUDA) for every model class that supports it, Qwen2 and Qwen3 included, and eager otherwise;
the tests check that a Qwen-shaped folder loads with ``sdpa``.

A tokenizer without a pad token gets its EOS token as pad (Llama-style base models ship
without one); the rollout layer pads itself and masks padding, so the choice never reaches
the loss.

A policy sharded by FSDP2 in place (``train.fsdp_replica false``: its parameters are
DTensors, each rank holding 1/W) is read whole through :func:`full_parameters` (one
all-gather per parameter, a collective) and saved with ``save_policy(..., state_dict=...)``.
transformers' ``save_pretrained`` writes on torch.distributed's rank 0 only; the folders
that every rank writes for its own vLLM engine go through :func:`write_policy` /
:func:`write_weights`, which write from any rank.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError

from mcgpo.model_names import hub_id_hint

__all__ = [
    "PolicyLoadError",
    "full_parameters",
    "full_weights",
    "holds_shards",
    "hub_id_hint",
    "load_policy",
    "save_policy",
    "write_policy",
    "write_tensors",
    "write_weights",
]


class PolicyLoadError(ValueError):
    """A policy folder cannot be loaded; the message names the folder and the problem."""


def load_policy(
    path: str | Path,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> tuple[Any, Any]:
    """Return ``(model, tokenizer)`` from a local folder written by ``save_pretrained``.

    Args:
        path: the folder (``config.json``, weights, tokenizer files).
        dtype: load the weights in this dtype (default: float32).
        device: move the model there (default: CPU).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(path)
    if not folder.exists():
        raise PolicyLoadError(f"policy folder {str(folder)!r} does not exist{hub_id_hint(path)}")
    if not folder.is_dir():
        raise PolicyLoadError(f"policy path {str(folder)!r} is not a folder")
    from mcgpo.policy.lora import is_adapter_folder

    if is_adapter_folder(folder):  # a LoRA run's model: its base with the adapters merged
        return _load_adapter_folder(folder, dtype=dtype, device=device)
    if not (folder / "config.json").is_file():
        inner = folder / "model"  # a run folder (mcgpo sft / train --out): its policy is inside
        hint = f"; it holds a run: its policy is {str(inner)!r}" if inner.is_dir() else ""
        raise PolicyLoadError(
            f"policy folder {str(folder)!r} has no config.json (not a Hugging Face model "
            f"folder){hint}"
        )
    try:
        with _quiet():
            tokenizer = _tokenizer_class(folder, AutoTokenizer).from_pretrained(
                folder, local_files_only=True
            )
    except (OSError, ValueError, TypeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise PolicyLoadError(
            f"policy folder {str(folder)!r}: cannot load the tokenizer ({first})"
        ) from err
    try:
        with _quiet():
            model = AutoModelForCausalLM.from_pretrained(
                folder, local_files_only=True, dtype=dtype or torch.float32
            )
    except (OSError, ValueError, KeyError, SafetensorError) as err:  # a damaged weights file too
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise PolicyLoadError(
            f"policy folder {str(folder)!r}: cannot load the model ({first})"
        ) from err
    if tokenizer.pad_token_id is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    if device is not None:
        model = model.to(device)
    return model, tokenizer


def _load_adapter_folder(
    folder: Path, *, dtype: torch.dtype | None, device: torch.device | str | None
) -> tuple[Any, Any]:
    """A PEFT adapter folder (:mod:`mcgpo.policy.lora`) loaded as PEFT loads it, onto the
    base model its config names, then merged into a plain model."""
    from peft import PeftModel

    from mcgpo.policy.lora import adapter_base

    base = adapter_base(folder)
    if base is None:
        raise PolicyLoadError(
            f"adapter folder {str(folder)!r} names no base model (base_model_name_or_path)"
        )
    try:
        model, tokenizer = load_policy(base, dtype=dtype, device=device)
    except PolicyLoadError as err:
        raise PolicyLoadError(f"adapter folder {str(folder)!r}: its base model: {err}") from None
    try:
        with _quiet():
            model = PeftModel.from_pretrained(model, folder).merge_and_unload()
    except (OSError, ValueError, KeyError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise PolicyLoadError(
            f"adapter folder {str(folder)!r}: cannot load the adapters ({first})"
        ) from err
    # PEFT loads for inference (the base frozen) and the merge keeps that: trainable again,
    # as a plain folder loads (mcgpo train --model <adapter folder> fine-tunes every weight)
    model.requires_grad_(True)
    return model, _adapter_tokenizer(folder, tokenizer)


def _adapter_tokenizer(folder: Path, base_tokenizer: Any) -> Any:
    """The tokenizer saved beside the adapters, or the base model's."""
    from transformers import AutoTokenizer

    if not (folder / "tokenizer_config.json").is_file():
        return base_tokenizer
    with _quiet():
        tokenizer = _tokenizer_class(folder, AutoTokenizer).from_pretrained(
            folder, local_files_only=True
        )
    if tokenizer.pad_token_id is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def save_policy(
    model: Any, tokenizer: Any, path: str | Path, *, state_dict: dict[str, Any] | None = None
) -> Path:
    """Write model (safetensors) and tokenizer to ``path`` (created if needed); return it.
    ``state_dict``: the weights to write instead of the model's own (a sharded policy's,
    gathered: :func:`full_weights`, or the learner's rank-0 gather). A LoRA policy
    (:mod:`mcgpo.policy.lora`) is written as a PEFT adapter folder (``state_dict``: its
    adapters' weights, gathered from a sharded policy)."""
    from mcgpo.policy.lora import has_lora, save_adapter

    if has_lora(model):  # a LoRA policy: its adapters (gathered if sharded), PEFT's folder
        return save_adapter(model, tokenizer, path, state_dict)
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    with _quiet():
        model.save_pretrained(folder, state_dict=state_dict)
        tokenizer.save_pretrained(folder)
    return folder


def holds_shards(model: Any) -> bool:
    """Whether ``model``'s parameters are FSDP2 shards (DTensors) rather than whole tensors."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def full_parameters(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """``model``'s parameters by name (a tied head once, under the embedding's name, as
    ``named_parameters`` gives it), each whole and detached: a DTensor shard is
    all-gathered first, so with a sharded policy this is a collective: every rank must
    iterate it to the end, in the same order. One gathered parameter at a time. A LoRA
    policy's are the merged weights under the base model's names
    (:func:`mcgpo.policy.lora.merged_parameters`)."""
    from torch.distributed.tensor import DTensor

    from mcgpo.policy.lora import has_lora, merged_parameters

    if has_lora(model):  # the base model's names, the adapters merged into its weights
        yield from merged_parameters(model)
        return
    for name, param in model.named_parameters():
        yield name, (param.full_tensor() if isinstance(param, DTensor) else param).detach()


def full_weights(model: Any) -> dict[str, torch.Tensor]:
    """``model``'s whole weights on the CPU as ``save_pretrained`` names them: the parameters
    (a tied head once) and the persistent buffers. A sharded policy's are all-gathered: a
    collective, every rank calls it."""
    weights = {name: t.cpu().contiguous() for name, t in full_parameters(model)}
    persistent = set(model.state_dict())
    for name, buf in model.named_buffers():
        if name in persistent:
            weights[name] = buf.detach().cpu().contiguous()
    return weights


def write_weights(model: Any, path: str | Path) -> Path:
    """``model``'s whole weights (:func:`full_weights`) into ``path/model.safetensors``, one
    file, from this process whatever its rank; returns the file. transformers'
    ``save_pretrained`` writes on torch.distributed's rank 0 only (5.x), but under several
    processes every rank's vLLM engine reads a folder of its own."""
    return write_tensors(full_weights(model), path)


def write_tensors(weights: Mapping[str, torch.Tensor], path: str | Path) -> Path:
    """``weights`` (whole tensors by their checkpoint names) into ``path/model.safetensors``
    atomically (an engine reading the folder never sees half a file); returns the file."""
    from safetensors.torch import save_file

    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "model.safetensors"
    tmp = folder / f".model.safetensors.{os.getpid()}.tmp"
    tensors = {name: t.detach().cpu().contiguous() for name, t in weights.items()}
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, target)
    return target


def write_policy(model: Any, tokenizer: Any, path: str | Path) -> Path:
    """A ``--model`` folder (config, generation config, weights as :func:`write_weights`,
    tokenizer) written by this process whatever its rank (see :func:`write_weights`);
    returns it. A sharded policy is gathered: a collective."""
    import copy

    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(model.config)
    config.architectures = getattr(config, "architectures", None) or [type(model).__name__]
    config.dtype = next(model.parameters()).dtype  # what the weights are, as save_pretrained
    with _quiet():
        config.save_pretrained(folder)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    write_weights(model, folder)
    return folder


def _tokenizer_class(folder: Path, auto: Any) -> Any:
    """The class to load the folder's tokenizer with (see the module docstring)."""
    from transformers import PreTrainedTokenizerFast

    config = folder / "tokenizer_config.json"
    if config.is_file() and (folder / "tokenizer.json").is_file():
        try:
            declared = json.loads(config.read_text()).get("tokenizer_class")
        except (json.JSONDecodeError, AttributeError):
            declared = None
        if declared in ("TokenizersBackend", "PreTrainedTokenizerFast"):
            return PreTrainedTokenizerFast
    return auto


@contextmanager
def _quiet() -> Iterator[None]:
    """Silence transformers' progress bars (library code does not print), then restore them;
    and the deprecation PEFT's merge triggers inside transformers (``is_gradient_checkpointing``),
    which is not the user's to act on."""
    from transformers.utils import logging

    was_enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning
            )
            yield
    finally:
        if was_enabled:
            logging.enable_progress_bar()
