"""The optimisation settings of a run (``[train]``, ``--train.*``): :class:`TrainConfig`,
its checks and the choices it resolves (pi_old's source, the rollout correction, the FSDP2
replica). Part of :class:`mcgpo.training.config.RunConfig`; split from it for length."""

from __future__ import annotations

from dataclasses import dataclass

from mcgpo.training.config_fields import ConfigError, at_least, choice, option, positive
from mcgpo.update_choices import (
    COMPILE_SETTINGS,
    KL_KINDS,
    PRECISIONS,
    ROLLOUT_CORRECTION_LEVELS,
    ROLLOUT_CORRECTIONS,
)

__all__ = ["FSDP_REPLICAS", "OLD_LOGPROBS", "SHARDINGS", "TrainConfig"]


# How the update is spread over W > 1 processes (mcgpo.training.distributed, scale-out.md).
SHARDINGS = ("ddp", "fsdp2")
FSDP_REPLICAS = ("auto", "true", "false")  # train.fsdp_replica
# Where pi_old comes from (train.old_logprobs); "auto" is resolved by TrainConfig.recompute_old.
OLD_LOGPROBS = ("auto", "sampler", "recompute")


@dataclass(frozen=True)
class TrainConfig:
    updates: int = option(150, "policy updates (one rollout batch each)")
    lr: float = option(1e-6, "AdamW learning rate")
    weight_decay: float = option(0.01, "AdamW weight decay")
    grad_clip: float = option(1.0, "gradient-norm clip; 0 = off")
    clip: float = option(0.2, "PPO ratio clip epsilon")
    dual_clip: float = option(3.0, "dual-clip c for negative advantages; 0 = off")
    kl_coef: float = option(0.01, "KL-to-reference loss coefficient; 0 = no reference model")
    kl_kind: str = option("low_var_kl", "KL estimator: low_var_kl (k3), kl (k1), mse (k2), abs")
    entropy_coef: float = option(0.001, "entropy bonus coefficient")
    ppo_epochs: int = option(1, "passes over each rollout batch")
    mini_batch_size: int = option(
        0,
        "rows per optimiser step, at most (whole task groups; a larger group is a step alone); "
        "0 = the whole batch",
    )
    micro_batch_size: int = option(32, "rows per forward/backward pass (gradient accumulation)")
    logits_chunk: int = option(
        0, "positions per chunk of the LM head (large vocabularies); 0 = all"
    )
    gradient_checkpointing: bool = option(False, "recompute activations in backward (large models)")
    save_every: int = option(5, "checkpoint every k updates (and at the end); 0 = only at the end")
    max_failed_updates: int = option(
        3,
        "stop the run (exit 1, last checkpoint kept for --resume) after this many updates "
        "in a row whose every trajectory hit an environment error",
    )
    sharding: str = option(
        "ddp",
        "update across processes: ddp (replicated) or fsdp2 (gradients and optimiser state "
        "sharded, fully_shard); no effect in one process; see scale-out.md",
    )
    fsdp_replica: str = option(
        "auto",
        "fsdp2 on several processes: keep a full fp32 copy of the policy on every rank for "
        "sampling, evaluation and saving (true), or not (false: rollout.engine vllm samples "
        "and evaluates, the weights are gathered one parameter at a time); auto = false "
        "with rollout.engine vllm, else true; docs/scale-out.md",
    )
    precision: str = option(
        "fp32",
        "fp32, bf16-mixed (bf16 autocast, fp32 weights and AdamW state) or bf16 (bf16 weights); "
        "docs/reference/update.md 'Precision and pi_old'",
    )
    old_logprobs: str = option(
        "auto",
        "pi_old from the sampler, or recompute (a no-grad training forward before the "
        "update); auto = recompute unless precision is fp32, rollout.engine is hf, "
        "rollout.temperature is 1 and train.rollout_correction is auto or none",
    )
    old_logprobs_check: bool = option(
        False, "with pi_old from the sampler, still run that forward to log pi_old/* mismatch"
    )
    rollout_correction: str = option(
        "auto",
        "importance weights pi_old / sampler on the policy-gradient tokens: none, tis "
        "(truncated at the cap), mis (masked outside [1/cap, cap]); auto = tis when "
        "rollout.engine is vllm or precision is not fp32, else none (docs/reference/update.md)",
    )
    rollout_correction_level: str = option(
        "token", "rollout correction per token, or per sequence (a response's ratio product)"
    )
    rollout_correction_cap: float = option(
        2.0, "tis: weights truncated at it; mis: ratios outside [1/cap, cap] masked; > 1"
    )
    tf32: bool = option(True, "TF32 matmuls for float32 on CUDA (no effect on CPU)")
    compile: str = option(
        "auto",
        "compiled decoder layers for the update's forwards: true, false, or auto (true on "
        "CUDA only); docs/reference/gpu.md 'Compiled layers'",
    )
    lora_rank: int = option(
        0, "LoRA adapters of this rank on the policy (PEFT; docs/lora.md); 0 = full fine-tuning"
    )
    lora_alpha: float = option(16.0, "LoRA scale numerator: adapters add (alpha / rank) B A")
    lora_dropout: float = option(0.0, "dropout on the LoRA adapters' input, in [0, 1)")
    lora_targets: str = option(
        "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
        "modules that get adapters: comma-separated names (attention and MLP projections by "
        "default) or all-linear",
    )
    lora_merge: bool = option(
        False, "LoRA: also write the final policy merged, a plain model folder <out>/merged"
    )
    pair_probe: bool = option(
        False,
        "MCGPO diagnostics: the task and pair terms' gradient norms on each update's first "
        "step (pairs/grad_ratio, pairs/grad_cos; two extra backward passes) and the pairs' "
        "margin after the update (pairs/margin_after); one process only",
    )
    async_lag: int = option(
        0,
        "rollouts sampled ahead of the update: batch v with the weights after update "
        "max(0, v - 1 - k); 0 = sequential; >= 1 recomputes pi_old and corrects for the "
        "sampler (docs/async.md)",
    )

    def check(self) -> None:
        at_least("train.updates", self.updates, 0)
        at_least("train.max_failed_updates", self.max_failed_updates, 1)
        positive("train.lr", self.lr)
        for name in ("weight_decay", "grad_clip", "kl_coef", "entropy_coef"):
            at_least(f"train.{name}", getattr(self, name), 0.0)
        positive("train.clip", self.clip)
        if self.dual_clip != 0 and not self.dual_clip > 1:
            raise ConfigError(f"train.dual_clip must be 0 (off) or > 1, got {self.dual_clip}")
        choice("train.kl_kind", self.kl_kind, KL_KINDS)
        at_least("train.ppo_epochs", self.ppo_epochs, 1)
        at_least("train.mini_batch_size", self.mini_batch_size, 0)
        at_least("train.micro_batch_size", self.micro_batch_size, 1)
        at_least("train.logits_chunk", self.logits_chunk, 0)
        at_least("train.save_every", self.save_every, 0)
        choice("train.sharding", self.sharding, SHARDINGS)
        choice("train.fsdp_replica", self.fsdp_replica, FSDP_REPLICAS)
        choice("train.precision", self.precision, PRECISIONS)
        choice("train.old_logprobs", self.old_logprobs, OLD_LOGPROBS)
        choice("train.compile", self.compile, COMPILE_SETTINGS)
        choice("train.rollout_correction", self.rollout_correction, ("auto", *ROLLOUT_CORRECTIONS))
        choice(
            "train.rollout_correction_level",
            self.rollout_correction_level,
            ROLLOUT_CORRECTION_LEVELS,
        )
        self.check_lora()
        cap = self.rollout_correction_cap
        if not 1 < cap < float("inf"):
            raise ConfigError(f"train.rollout_correction_cap must be > 1 and finite, got {cap}")
        at_least("train.async_lag", self.async_lag, 0)
        if self.async_lag and self.old_logprobs == "sampler":
            raise ConfigError(
                f"train.async_lag {self.async_lag} needs pi_old from a training forward "
                f"(train.old_logprobs recompute or auto): the sampler's log-probs are of "
                f"weights {self.async_lag} update(s) old"
            )
        if self.rollout_correction in ("tis", "mis") and self.old_logprobs == "sampler":
            raise ConfigError(
                f"train.rollout_correction {self.rollout_correction} needs pi_old from a "
                f"training forward (train.old_logprobs recompute or auto): with pi_old from "
                f"the sampler every ratio pi_old / sampler is 1"
            )

    def check_lora(self) -> None:
        """LoRA options: a rank >= 0; the others only with a rank (a LoRA option set at
        rank 0, full fine-tuning, would be silently ignored)."""
        at_least("train.lora_rank", self.lora_rank, 0)
        if self.lora_rank == 0:
            for name in ("lora_alpha", "lora_dropout", "lora_targets", "lora_merge"):
                if getattr(self, name) != getattr(TrainConfig, name):
                    raise ConfigError(
                        f"train.{name} is set but train.lora_rank is 0 (full fine-tuning); "
                        f"set train.lora_rank >= 1"
                    )
            return
        positive("train.lora_alpha", self.lora_alpha)
        if not 0 <= self.lora_dropout < 1:
            raise ConfigError(f"train.lora_dropout must be in [0, 1), got {self.lora_dropout}")
        if not any(t.strip() for t in self.lora_targets.split(",")):
            raise ConfigError("train.lora_targets is empty")

    def recompute_old(self) -> bool:
        """Whether pi_old comes from a training forward (``old_logprobs``, auto resolved:
        also when a rollout correction is asked for, which compares the two)."""
        if self.old_logprobs == "auto":
            stale = self.async_lag > 0  # pi_old is the proximal policy, not the sampler's
            return stale or self.precision != "fp32" or self.rollout_correction in ("tis", "mis")
        return self.old_logprobs == "recompute"

    def keep_replica(self, engine: str = "hf") -> bool:
        """Whether an FSDP2 run keeps a full copy of the policy on every rank
        (``fsdp_replica``, auto resolved for ``rollout.engine``: only mcgpo's own samplers
        need it, vLLM samples from its own copy of the weights)."""
        if self.fsdp_replica == "auto":
            return engine != "vllm"
        return self.fsdp_replica == "true"

    def correction(self, engine: str = "hf") -> str:
        """``rollout_correction`` with auto resolved for ``rollout.engine``: tis where the
        sampler's kernels or precision differ from the update's (vllm, or precision not
        fp32), none with mcgpo's fp32 samplers (their log-probs equal the training
        forward's to ~1e-6) and whenever pi_old is the sampler's (every ratio is 1)."""
        if self.rollout_correction != "auto":
            return self.rollout_correction
        if self.old_logprobs == "sampler":
            return "none"
        stale = self.async_lag > 0  # the sampler's weights are older than pi_old
        return "tis" if stale or engine == "vllm" or self.precision != "fp32" else "none"
