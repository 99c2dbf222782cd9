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
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

__all__ = ["PolicyLoadError", "load_policy", "save_policy"]


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
        raise PolicyLoadError(f"policy folder {str(folder)!r} does not exist")
    if not folder.is_dir():
        raise PolicyLoadError(f"policy path {str(folder)!r} is not a folder")
    if not (folder / "config.json").is_file():
        raise PolicyLoadError(
            f"policy folder {str(folder)!r} has no config.json (not a Hugging Face model folder)"
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
    except (OSError, ValueError, KeyError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise PolicyLoadError(
            f"policy folder {str(folder)!r}: cannot load the model ({first})"
        ) from err
    if tokenizer.pad_token_id is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    if device is not None:
        model = model.to(device)
    return model, tokenizer


def save_policy(model: Any, tokenizer: Any, path: str | Path) -> Path:
    """Write model (safetensors) and tokenizer to ``path`` (created if needed); return it."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    with _quiet():
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
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
    """Silence transformers' progress bars (library code does not print), then restore them."""
    from transformers.utils import logging

    was_enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            logging.enable_progress_bar()
