"""The base model's dropout, off for reinforcement learning.

A PPO-style update compares the policy's log-probs with pi_old's token by token: the ratio
exp(log pi_theta - log pi_old) is 1 before the first step, and the clip measures how far the
update moved the policy. With the model's own dropout on, every forward of the update (and
the recompute of pi_old, which runs in the same mode) is one random draw of a thinned
network, while the sampler played the whole one (in eval mode): the ratio is then noise even
where the weights have not moved, and the clip fires on that noise. So, as in the RL
trainers of the field (TRL's ``disable_dropout``, OpenRLHF), a training run turns the base
model's dropout off: every dropout module's rate, and every attention module's dropout
rate (a float such as ``attention_dropout``, which Hugging Face attention reads only in
train mode), is set to 0 on the loaded modules. The model's config is left as it is, so a
saved policy keeps the rates it came with. Most current LLM configs already have 0 (Qwen,
Llama); GPT-2 (0.1) and others do not.

LoRA adapter dropout (``train.lora_dropout``) is a setting of the run and stays: pi_old's
recompute turns it off (:func:`mcgpo.policy.lora.adapter_dropout_off`).
"""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["base_dropout_off"]


def base_dropout_off(model: Any) -> dict[str, float]:
    """Set every dropout rate of ``model``'s base modules to 0 (module docstring); returns
    the nonzero rates found, by module path and attribute (empty: nothing had dropout).
    LoRA adapter dropout (modules under a ``lora_dropout`` container) is left as it is."""
    found: dict[str, float] = {}
    for path, module in model.named_modules():
        if "lora_dropout" in path.split("."):
            continue
        if isinstance(module, nn.modules.dropout._DropoutNd):
            if module.p > 0:
                found[f"{path}.p"] = float(module.p)
            module.p = 0.0
            continue
        for name, value in vars(module).items():
            if "dropout" in name and isinstance(value, float) and not isinstance(value, bool):
                if value > 0:
                    found[f"{path}.{name}"] = value
                setattr(module, name, 0.0)
    return found
