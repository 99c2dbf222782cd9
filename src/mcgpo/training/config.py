"""Run configuration: frozen dataclasses, the one place where the run's own defaults live.

One dataclass per concern (environment, rollout, algorithm, optimisation, evaluation, warm
start), nested in :class:`RunConfig`. Each field's ``help`` is its ``--help`` line, and the
nesting gives the dotted flag (``train.lr`` <-> ``--train.lr``, ``[train] lr = ...`` in TOML).
Defaults are the papers' recipe (GiGPO/verl-agent, arXiv 2505.10978; see
reference/algorithms.md 1.4); presets (``mcgpo/presets/*.toml``) change them for a scale.

Estimator, preference and environment options are not fields: they belong to the estimator
chosen by ``algo.name`` (checked by its options class, ``mcgpo.ESTIMATOR_OPTIONS`` /
``PreferenceOptions``: ``--algo.omega 0.2``,
``--algo.pairs.kappa 2``) and to the environment (checked by building one:
``--env.n_receptacles 12``). Their defaults live with their owners; the resolved config
written to a run folder lists the algorithm's in full.

The loss coefficients (``train.clip``, ``dual_clip``, ``kl_coef``, ``kl_kind``,
``entropy_coef``) and ``algo.lambda_pair`` have their defaults here only: the objectives take
them as arguments. Two values are read from their owners instead of copied: the KL kinds
from :mod:`mcgpo.objectives` (imported by :meth:`TrainConfig.check` only, so that reading a
config does not import torch) and the shaping coefficient from :mod:`mcgpo.shaping`.

Resolution: dataclass defaults, then a preset, then command-line flags (:mod:`mcgpo.cli`);
the nested-dict (TOML) layout they are read from and written to is
:mod:`mcgpo.training.config_layout`. Unknown keys and bad values raise :class:`ConfigError`
naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mcgpo.envs.pool import DEFAULT_STEP_TIMEOUT
from mcgpo.shaping import SHAPING_COEF

__all__ = [
    "FSDP_REPLICAS",
    "LAMBDA_PAIR",
    "SHARDINGS",
    "TRACKERS",
    "AlgoConfig",
    "ConfigError",
    "EnvConfig",
    "EvalConfig",
    "RolloutConfig",
    "RunConfig",
    "SFTConfig",
    "TrainConfig",
]


# The weight of the MCGPO pair loss. The paper's value is unknown; 10.0 since issue 35's
# dose-response, on mechanistic grounds: at 1.0 the pair term's gradient norm is ~2 % of the
# task term's and the update ranks its pairs as the task term alone does; at 10 it moves them
# (docs/algorithms/mcgpo.md, λ_pair). Was 1.0 from a one-seed sweep (§3a), 0.1 before.
# Defined here only: the loss takes it as an argument.
LAMBDA_PAIR = 10.0


# How the update is spread over W > 1 processes (mcgpo.training.distributed, scale-out.md).
SHARDINGS = ("ddp", "fsdp2")
FSDP_REPLICAS = ("auto", "true", "false")  # train.fsdp_replica
# Where pi_old comes from (train.old_logprobs); "auto" is resolved by TrainConfig.recompute_old.
OLD_LOGPROBS = ("auto", "sampler", "recompute")
# The experiment trackers --report_to may name (mcgpo.training.tracking), besides "none".
TRACKERS = ("tensorboard", "wandb", "mlflow", "trackio")


class ConfigError(ValueError):
    """A configuration value or key is wrong; the message is one line naming the key."""


def _opt(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class EnvConfig:
    name: str = _opt(
        "household",
        "environment: household, webshop, alfworld, textworld-express, remote (served by "
        "mcgpo env serve; docs/envs/serving.md), or an installed mcgpo.envs plugin "
        "(docs/envs/your-own.md)",
    )
    max_turns: int = _opt(0, "turns per episode; 0 = the environment's own limit")
    train_split: str = _opt("train", "split the training tasks come from")
    workers: int = _opt(
        0, "environment worker processes; 0 = step in this process (fastest for built-in envs)"
    )
    step_timeout: float = _opt(
        DEFAULT_STEP_TIMEOUT,
        "seconds a step in a worker may take before its trajectory is marked errored",
    )
    # Options of the environment's constructor (--env.<option>, e.g. --env.n_receptacles 12),
    # checked by building one environment in the trainer setup.
    options: Mapping[str, Any] = field(default_factory=dict, metadata={"help": ""})

    def check(self) -> None:
        _at_least("env.max_turns", self.max_turns, 0)
        _at_least("env.workers", self.workers, 0)
        _positive("env.step_timeout", self.step_timeout)


@dataclass(frozen=True)
class RolloutConfig:
    groups: int = _opt(16, "tasks per update (G)")
    group_size: int = _opt(8, "sibling rollouts per task (N)")
    temperature: float = _opt(1.0, "sampling temperature for training rollouts")
    max_new_tokens: int = _opt(512, "response tokens per turn")
    max_prompt_tokens: int = _opt(2048, "prompt tokens per turn (longer prompts are cut)")
    history: int = _opt(2, "(observation, action) pairs of history in the prompt")
    response_format: str = _opt(
        "auto", "think (<think>..</think><action>..</action>), action, or auto (by tokenizer)"
    )
    sampler: str = _opt(
        "dynamic",
        "dynamic (KV cache; finished rows leave the batch) or static (preallocated cache, "
        "decode step compiled with CUDA graphs on a GPU)",
    )
    decode_attention: str = _opt(
        "gqa",
        "static sampler's single-token attention: gqa (K/V never copied per query head, "
        "filled cache columns only) or sdpa (transformers' own; docs/rollout.md)",
    )
    engine: str = _opt(
        "hf",
        "rollout engine: hf (mcgpo's samplers, rollout.sampler) or vllm (a colocated vLLM "
        "engine, weights synced after every update; the vllm extra, docs/rollout.md)",
    )
    vllm_gpu_memory_utilization: float = _opt(
        0.0,
        "rollout.engine vllm on a GPU: the share of its memory vLLM may take; 0 = planned "
        "from the model (weights + KV cache for this rank's rows at full context)",
    )
    vllm_dtype: str = _opt(
        "auto",
        "rollout.engine vllm: auto (bfloat16 on a GPU that has it, whatever the master "
        "weights; on a CPU the update's dtype), bfloat16 or float32",
    )
    vllm_sleep: bool = _opt(
        False, "rollout.engine vllm on a GPU: free vLLM's memory during the update (sleep mode)"
    )
    overlap_env: bool = _opt(
        False,
        "environment steps overlapped with decoding: two halves of the rollouts in ping-pong "
        "(the same tokens and episodes, faster where environments are slow; docs/async.md)",
    )

    def check(self) -> None:
        for name in ("groups", "group_size", "max_new_tokens", "max_prompt_tokens"):
            _at_least(f"rollout.{name}", getattr(self, name), 1)
        _at_least("rollout.history", self.history, 0)
        if not self.temperature > 0:  # greedy siblings would all act alike: nothing to compare
            raise ConfigError(
                f"rollout.temperature must be > 0 (at 0 the N siblings of a task act alike), "
                f"got {self.temperature}"
            )
        _choice("rollout.response_format", self.response_format, ("auto", "think", "action"))
        # the names of mcgpo.rollout.static_decode.SAMPLERS (not imported: it imports torch)
        _choice("rollout.sampler", self.sampler, ("dynamic", "static"))
        # mcgpo.rollout.decode_attention.DECODE_ATTENTIONS (not imported: it imports torch)
        _choice("rollout.decode_attention", self.decode_attention, ("gqa", "sdpa"))
        # the names of mcgpo.rollout.vllm_launch.ENGINES (not imported: it imports vLLM)
        _choice("rollout.engine", self.engine, ("hf", "vllm"))
        u = self.vllm_gpu_memory_utilization
        if not 0 <= u <= 1:
            raise ConfigError(
                f"rollout.vllm_gpu_memory_utilization must be in [0, 1] (0 = planned), got {u}"
            )
        # the names of mcgpo.rollout.vllm_launch.DTYPES (not imported: it imports vLLM)
        _choice("rollout.vllm_dtype", self.vllm_dtype, ("auto", "bfloat16", "float32"))


@dataclass(frozen=True)
class AlgoConfig:
    name: str = _opt("mcgpo", "algorithm: an estimator name, mcgpo or graphgpo_shaping")
    lambda_pair: float = _opt(LAMBDA_PAIR, "weight of the MCGPO pair loss (mcgpo only)")
    shaping_coef: float = _opt(SHAPING_COEF, "progress-shaping coefficient (graphgpo_shaping only)")
    # Options of the chosen estimator (--algo.<option>) and of build_preferences
    # (--algo.pairs.<option>); checked by their options classes in resolve_algo.
    estimator: Mapping[str, Any] = field(default_factory=dict, metadata={"help": ""})
    pairs: Mapping[str, Any] = field(default_factory=dict, metadata={"help": ""})
    # [algo.<estimator>] tables (--algo.<estimator>.<option>): options that apply only when
    # the algorithm runs that estimator (mcgpo and graphgpo_shaping run graphgpo), so that
    # one preset can name GraphGPO's omega and still run every method of a bench.
    per_estimator: Mapping[str, Mapping[str, Any]] = field(
        default_factory=dict, metadata={"help": ""}
    )

    def check(self) -> None:
        _at_least("algo.lambda_pair", self.lambda_pair, 0.0)
        _at_least("algo.shaping_coef", self.shaping_coef, 0.0)


@dataclass(frozen=True)
class TrainConfig:
    updates: int = _opt(150, "policy updates (one rollout batch each)")
    lr: float = _opt(1e-6, "AdamW learning rate")
    weight_decay: float = _opt(0.01, "AdamW weight decay")
    grad_clip: float = _opt(1.0, "gradient-norm clip; 0 = off")
    clip: float = _opt(0.2, "PPO ratio clip epsilon")
    dual_clip: float = _opt(3.0, "dual-clip c for negative advantages; 0 = off")
    kl_coef: float = _opt(0.01, "KL-to-reference loss coefficient; 0 = no reference model")
    kl_kind: str = _opt("low_var_kl", "KL estimator: low_var_kl (k3), kl (k1), mse (k2), abs")
    entropy_coef: float = _opt(0.001, "entropy bonus coefficient")
    ppo_epochs: int = _opt(1, "passes over each rollout batch")
    mini_batch_size: int = _opt(
        0,
        "rows per optimiser step, at most (whole task groups; a larger group is a step alone); "
        "0 = the whole batch",
    )
    micro_batch_size: int = _opt(32, "rows per forward/backward pass (gradient accumulation)")
    logits_chunk: int = _opt(0, "positions per chunk of the LM head (large vocabularies); 0 = all")
    gradient_checkpointing: bool = _opt(False, "recompute activations in backward (large models)")
    save_every: int = _opt(5, "checkpoint every k updates (and at the end); 0 = only at the end")
    max_failed_updates: int = _opt(
        3,
        "stop the run (exit 1, last checkpoint kept for --resume) after this many updates "
        "in a row whose every trajectory hit an environment error",
    )
    sharding: str = _opt(
        "ddp",
        "update across processes: ddp (replicated) or fsdp2 (gradients and optimiser state "
        "sharded, fully_shard); no effect in one process; see scale-out.md",
    )
    fsdp_replica: str = _opt(
        "auto",
        "fsdp2 on several processes: keep a full fp32 copy of the policy on every rank for "
        "sampling, evaluation and saving (true), or not (false: rollout.engine vllm samples "
        "and evaluates, the weights are gathered one parameter at a time); auto = false "
        "with rollout.engine vllm, else true; docs/scale-out.md",
    )
    precision: str = _opt(
        "fp32",
        "fp32, bf16-mixed (bf16 autocast, fp32 weights and AdamW state) or bf16 (bf16 weights); "
        "docs/reference/update.md 'Precision and pi_old'",
    )
    old_logprobs: str = _opt(
        "auto",
        "pi_old from the sampler, or recompute (a no-grad training forward before the "
        "update); auto = recompute unless precision is fp32, rollout.engine is hf, "
        "rollout.temperature is 1 and train.rollout_correction is auto or none",
    )
    old_logprobs_check: bool = _opt(
        False, "with pi_old from the sampler, still run that forward to log pi_old/* mismatch"
    )
    rollout_correction: str = _opt(
        "auto",
        "importance weights pi_old / sampler on the policy-gradient tokens: none, tis "
        "(truncated at the cap), mis (masked outside [1/cap, cap]); auto = tis when "
        "rollout.engine is vllm or precision is not fp32, else none (docs/reference/update.md)",
    )
    rollout_correction_level: str = _opt(
        "token", "rollout correction per token, or per sequence (a response's ratio product)"
    )
    rollout_correction_cap: float = _opt(
        2.0, "tis: weights truncated at it; mis: ratios outside [1/cap, cap] masked; > 1"
    )
    tf32: bool = _opt(True, "TF32 matmuls for float32 on CUDA (no effect on CPU)")
    compile: str = _opt(
        "auto",
        "compiled decoder layers for the update's forwards: true, false, or auto (true on "
        "CUDA only); docs/reference/gpu.md 'Compiled layers'",
    )
    lora_rank: int = _opt(
        0, "LoRA adapters of this rank on the policy (PEFT; docs/lora.md); 0 = full fine-tuning"
    )
    lora_alpha: float = _opt(16.0, "LoRA scale numerator: adapters add (alpha / rank) B A")
    lora_dropout: float = _opt(0.0, "dropout on the LoRA adapters' input, in [0, 1)")
    lora_targets: str = _opt(
        "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
        "modules that get adapters: comma-separated names (attention and MLP projections by "
        "default) or all-linear",
    )
    lora_merge: bool = _opt(
        False, "LoRA: also write the final policy merged, a plain model folder <out>/merged"
    )
    pair_probe: bool = _opt(
        False,
        "MCGPO diagnostics: the task and pair terms' gradient norms on each update's first "
        "step (pairs/grad_ratio, pairs/grad_cos; two extra backward passes) and the pairs' "
        "margin after the update (pairs/margin_after); one process only",
    )
    async_lag: int = _opt(
        0,
        "rollouts sampled ahead of the update: batch v with the weights after update "
        "max(0, v - 1 - k); 0 = sequential; >= 1 recomputes pi_old and corrects for the "
        "sampler (docs/async.md)",
    )

    def check(self) -> None:
        _at_least("train.updates", self.updates, 0)
        _at_least("train.max_failed_updates", self.max_failed_updates, 1)
        _positive("train.lr", self.lr)
        for name in ("weight_decay", "grad_clip", "kl_coef", "entropy_coef"):
            _at_least(f"train.{name}", getattr(self, name), 0.0)
        _positive("train.clip", self.clip)
        if self.dual_clip != 0 and not self.dual_clip > 1:
            raise ConfigError(f"train.dual_clip must be 0 (off) or > 1, got {self.dual_clip}")
        from mcgpo.objectives import KL_KINDS  # defined beside the estimators (imports torch)

        _choice("train.kl_kind", self.kl_kind, KL_KINDS)
        _at_least("train.ppo_epochs", self.ppo_epochs, 1)
        _at_least("train.mini_batch_size", self.mini_batch_size, 0)
        _at_least("train.micro_batch_size", self.micro_batch_size, 1)
        _at_least("train.logits_chunk", self.logits_chunk, 0)
        _at_least("train.save_every", self.save_every, 0)
        _choice("train.sharding", self.sharding, SHARDINGS)
        _choice("train.fsdp_replica", self.fsdp_replica, FSDP_REPLICAS)
        from mcgpo.policy.precision import PRECISIONS  # beside autocast (imports torch)

        _choice("train.precision", self.precision, PRECISIONS)
        _choice("train.old_logprobs", self.old_logprobs, OLD_LOGPROBS)
        from mcgpo.policy.compile import COMPILE_SETTINGS  # beside torch.compile (imports torch)

        _choice("train.compile", self.compile, COMPILE_SETTINGS)
        from mcgpo.objectives import ROLLOUT_CORRECTION_LEVELS, ROLLOUT_CORRECTIONS

        _choice("train.rollout_correction", self.rollout_correction, ("auto", *ROLLOUT_CORRECTIONS))
        _choice(
            "train.rollout_correction_level",
            self.rollout_correction_level,
            ROLLOUT_CORRECTION_LEVELS,
        )
        self.check_lora()
        cap = self.rollout_correction_cap
        if not 1 < cap < float("inf"):
            raise ConfigError(f"train.rollout_correction_cap must be > 1 and finite, got {cap}")
        _at_least("train.async_lag", self.async_lag, 0)
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
        _at_least("train.lora_rank", self.lora_rank, 0)
        if self.lora_rank == 0:
            for name in ("lora_alpha", "lora_dropout", "lora_targets", "lora_merge"):
                if getattr(self, name) != getattr(TrainConfig, name):
                    raise ConfigError(
                        f"train.{name} is set but train.lora_rank is 0 (full fine-tuning); "
                        f"set train.lora_rank >= 1"
                    )
            return
        _positive("train.lora_alpha", self.lora_alpha)
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


@dataclass(frozen=True)
class EvalConfig:
    every: int = _opt(5, "evaluate every k updates (and before the first and after the last)")
    tasks: int = _opt(128, "held-out tasks per evaluation")
    split: str = _opt("valid_seen", "split the held-out tasks come from")
    temperature: float = _opt(0.4, "sampling temperature for evaluation; 0 = greedy")

    def check(self) -> None:
        _at_least("eval.every", self.every, 0)
        _at_least("eval.tasks", self.tasks, 0)
        _at_least("eval.temperature", self.temperature, 0.0)


@dataclass(frozen=True)
class SFTConfig:
    demos: int = _opt(200, "expert episodes (training tasks) used as demonstrations")
    epochs: int = _opt(2, "passes over the demonstration turns")
    noise: float = _opt(
        0.0, "chance of a random admissible action in the demo roll-in (expert labels all turns)"
    )
    lr: float = _opt(1e-3, "AdamW learning rate for the warm start")
    weight_decay: float = _opt(0.01, "AdamW weight decay for the warm start")
    grad_clip: float = _opt(1.0, "gradient-norm clip for the warm start; 0 = off")
    warmup: int = _opt(10, "steps of linear learning-rate warm-up")
    batch_size: int = _opt(32, "demonstration turns per optimiser step")
    micro_batch_size: int = _opt(
        8,
        "turns per forward/backward inside a step: the step's turns sorted by length and cut "
        "into micro-batches (less padding, same gradient); 0 = the whole step at once",
    )

    def check(self) -> None:
        _at_least("sft.demos", self.demos, 1)
        _at_least("sft.epochs", self.epochs, 1)
        if not 0.0 <= self.noise < 1.0:
            raise ConfigError(f"sft.noise must be in [0, 1), got {self.noise}")
        _positive("sft.lr", self.lr)
        _at_least("sft.weight_decay", self.weight_decay, 0.0)
        _at_least("sft.grad_clip", self.grad_clip, 0.0)
        _at_least("sft.warmup", self.warmup, 0)
        _at_least("sft.batch_size", self.batch_size, 1)
        _at_least("sft.micro_batch_size", self.micro_batch_size, 0)


@dataclass(frozen=True)
class RunConfig:
    model: str = _opt("tiny", "policy folder (save_pretrained), or 'tiny' for a fresh tiny model")
    corpus_episodes: int = _opt(
        256, "training episodes whose text trains the tiny model's tokenizer (model = 'tiny')"
    )
    out: str = _opt("runs/run", "run folder: config, metrics, checkpoints, final model")
    preset: str = _opt("", "preset name (mcgpo/presets) or path of a TOML file")
    device: str = _opt("cpu", "torch device: cpu or cuda")
    seed: int = _opt(0, "seed of everything (tasks, sampling, model init)")
    threads: int = _opt(0, "torch CPU threads; 0 = torch's default")
    deterministic: bool = _opt(False, "torch deterministic algorithms (bit-identical resume)")
    resume: bool = _opt(
        False,
        "continue the run in --out from its latest checkpoint; its config.toml is the base, "
        "so give only what changes (e.g. --train.updates)",
    )
    save_rollouts: bool = _opt(False, "save each update's StepTable as Parquet")
    tensorboard: bool = _opt(
        True, "write TensorBoard event files (false: as if report_to left tensorboard out)"
    )
    report_to: str = _opt(
        "tensorboard",
        "experiment trackers fed every metrics.jsonl record, comma-separated: tensorboard, "
        "wandb, mlflow, trackio, or none (as Hugging Face Trainer's --report_to; wandb, mlflow "
        "and trackio need the tracking extra); docs/training.md 'Tracking'",
    )
    progress: bool = _opt(True, "show a progress bar")
    nproc: int = _opt(
        1, "processes on this machine (world size; torchrun sets it); see scale-out.md"
    )
    backend: str = _opt("auto", "torch.distributed backend: auto (gloo on CPU, nccl on CUDA)")
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)

    def check(self) -> None:
        """Validate every section; raise :class:`ConfigError` naming the first bad key."""
        if not self.model:
            raise ConfigError("model must be a folder or 'tiny'")
        if not self.out:
            raise ConfigError("out must name a run folder")
        if self.device != "cpu" and not self.device.startswith("cuda"):
            raise ConfigError(f"device must be cpu or cuda[:N], got {self.device!r}")
        _at_least("threads", self.threads, 0)
        _at_least("nproc", self.nproc, 1)
        _choice("backend", self.backend, ("auto", "gloo", "nccl"))
        _at_least("corpus_episodes", self.corpus_episodes, 1)
        self.trackers()
        for section in (self.env, self.rollout, self.algo, self.train, self.eval, self.sft):
            section.check()
        if self.train.old_logprobs == "sampler" and self.rollout.temperature != 1:
            raise ConfigError(
                f"train.old_logprobs sampler needs rollout.temperature 1: at "
                f"{self.rollout.temperature} the sampler's log-probs are the sampling "
                f"distribution's, not the policy's (use recompute or auto)"
            )
        if not self.train.keep_replica(self.rollout.engine) and self.rollout.engine != "vllm":
            raise ConfigError(
                f"train.fsdp_replica false needs rollout.engine vllm: the "
                f"{self.rollout.engine} sampler generates from the full replica"
            )
        if self.train.async_lag and self.rollout.engine != "hf":
            raise ConfigError(
                f"train.async_lag {self.train.async_lag} needs rollout.engine hf: the producer "
                f"samples from its own replica of the policy, and the colocated "
                f"{self.rollout.engine} engine holds one version of the weights (and sleeps "
                f"through the update); use --train.async_lag 0"
            )

    def trackers(self) -> tuple[str, ...]:
        """The trackers of ``report_to`` in its order, without repeats (``none``: no
        tracker; ``tensorboard`` false drops TensorBoard); a ConfigError names a wrong one."""
        names = [n.strip() for n in self.report_to.split(",") if n.strip()]
        if names == ["none"]:
            return ()
        if "none" in names:
            raise ConfigError(
                f"report_to: none cannot be combined with trackers ({self.report_to})"
            )
        for name in names:
            if name not in TRACKERS:
                import difflib

                close = difflib.get_close_matches(name, (*TRACKERS, "none"), n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise ConfigError(
                    f"report_to: unknown tracker {name!r}{hint}; choose from "
                    f"{', '.join(TRACKERS)}, or none"
                )
        if not names:
            raise ConfigError("report_to is empty; name a tracker or none")
        kept = dict.fromkeys(names)
        if not self.tensorboard:
            kept.pop("tensorboard", None)
        return tuple(kept)


def _at_least(key: str, value: float, low: float) -> None:
    if not value >= low:
        raise ConfigError(f"{key} must be >= {low}, got {value}")


def _positive(key: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(f"{key} must be > 0, got {value}")


def _choice(key: str, value: str, options: tuple[str, ...]) -> None:
    if value not in options:
        raise ConfigError(f"{key} must be one of {', '.join(options)}; got {value!r}")
