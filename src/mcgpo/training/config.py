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

:class:`TrainConfig` lives in :mod:`mcgpo.training.train_config` and the shared pieces
(:class:`ConfigError`, ``option``, the value checks) in :mod:`mcgpo.training.config_fields`;
both are importable from here as before.

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
from mcgpo.training.config_fields import ConfigError, at_least, choice, option, positive
from mcgpo.training.train_config import TrainConfig

__all__ = [
    "LAMBDA_PAIR",
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


# The experiment trackers --report_to may name (mcgpo.training.tracking), besides "none".
TRACKERS = ("tensorboard", "wandb", "mlflow", "trackio")


@dataclass(frozen=True)
class EnvConfig:
    name: str = option(
        "household",
        "environment: household, webshop, alfworld, textworld-express, remote (served by "
        "mcgpo env serve; docs/envs/serving.md), or an installed mcgpo.envs plugin "
        "(docs/envs/your-own.md)",
    )
    max_turns: int = option(0, "turns per episode; 0 = the environment's own limit")
    train_split: str = option("train", "split the training tasks come from")
    workers: int = option(
        0, "environment worker processes; 0 = step in this process (fastest for built-in envs)"
    )
    step_timeout: float = option(
        DEFAULT_STEP_TIMEOUT,
        "seconds a step in a worker may take before its trajectory is marked errored",
    )
    # Options of the environment's constructor (--env.<option>, e.g. --env.n_receptacles 12),
    # checked by building one environment in the trainer setup.
    options: Mapping[str, Any] = field(default_factory=dict, metadata={"help": ""})

    def check(self) -> None:
        at_least("env.max_turns", self.max_turns, 0)
        at_least("env.workers", self.workers, 0)
        positive("env.step_timeout", self.step_timeout)


@dataclass(frozen=True)
class RolloutConfig:
    groups: int = option(16, "tasks per update (G)")
    group_size: int = option(8, "sibling rollouts per task (N)")
    temperature: float = option(1.0, "sampling temperature for training rollouts")
    max_new_tokens: int = option(512, "response tokens per turn")
    max_prompt_tokens: int = option(2048, "prompt tokens per turn (longer prompts are cut)")
    history: int = option(2, "(observation, action) pairs of history in the prompt")
    response_format: str = option(
        "auto", "think (<think>..</think><action>..</action>), action, or auto (by tokenizer)"
    )
    sampler: str = option(
        "dynamic",
        "dynamic (KV cache; finished rows leave the batch) or static (preallocated cache, "
        "decode step compiled with CUDA graphs on a GPU)",
    )
    decode_attention: str = option(
        "gqa",
        "static sampler's single-token attention: gqa (K/V never copied per query head, "
        "filled cache columns only) or sdpa (transformers' own; docs/rollout.md)",
    )
    engine: str = option(
        "hf",
        "rollout engine: hf (mcgpo's samplers, rollout.sampler) or vllm (a colocated vLLM "
        "engine, weights synced after every update; the vllm extra, docs/rollout.md)",
    )
    vllm_gpu_memory_utilization: float = option(
        0.0,
        "rollout.engine vllm on a GPU: the share of its memory vLLM may take; 0 = planned "
        "from the model (weights + KV cache for this rank's rows at full context)",
    )
    vllm_dtype: str = option(
        "auto",
        "rollout.engine vllm: auto (bfloat16 on a GPU that has it, whatever the master "
        "weights; on a CPU the update's dtype), bfloat16 or float32",
    )
    vllm_sleep: bool = option(
        False,
        "rollout.engine vllm on a GPU: free vLLM's memory during the update (sleep mode; "
        "not with train.async_lag >= 1, where the engine samples during the update)",
    )
    overlap_env: bool = option(
        False,
        "environment steps overlapped with decoding: rollout.overlap_pieces pieces of the "
        "rollouts, some step while others decode (the same tokens and episodes but for "
        "rare float near ties, none with rollout.batch_invariant; faster where environments "
        "are slow; docs/async.md)",
    )
    overlap_pieces: int = option(
        2, "rollout.overlap_env: fixed pieces the rollouts are cut into (>= 2; docs/async.md)"
    )
    batch_invariant: bool = option(
        False,
        "decode every row in a sampler call of its own, so that no row's tokens or log-probs "
        "depend on which rows share its call (overlap pieces, groups, ranks): exactly the "
        "same rollouts, slower (one call per row; rollout.engine hf; docs/async.md)",
    )

    def check(self) -> None:
        for name in ("groups", "group_size", "max_new_tokens", "max_prompt_tokens"):
            at_least(f"rollout.{name}", getattr(self, name), 1)
        at_least("rollout.history", self.history, 0)
        at_least("rollout.overlap_pieces", self.overlap_pieces, 2)
        if self.overlap_pieces != 2 and not self.overlap_env:  # 2: the default, no choice made
            raise ConfigError(
                f"rollout.overlap_pieces {self.overlap_pieces} needs rollout.overlap_env true "
                "(the pieces are how overlapped environment steps cut the rollouts)"
            )
        if self.batch_invariant and self.engine != "hf":
            raise ConfigError(
                f"rollout.batch_invariant needs rollout.engine hf: the {self.engine} engine "
                "batches and caches prompt prefixes as it schedules them, so a row's "
                "arithmetic depends on its company there"
            )
        if not self.temperature > 0:  # greedy siblings would all act alike: nothing to compare
            raise ConfigError(
                f"rollout.temperature must be > 0 (at 0 the N siblings of a task act alike), "
                f"got {self.temperature}"
            )
        choice("rollout.response_format", self.response_format, ("auto", "think", "action"))
        # the names of mcgpo.rollout.static_decode.SAMPLERS (not imported: it imports torch)
        choice("rollout.sampler", self.sampler, ("dynamic", "static"))
        # mcgpo.rollout.decode_attention.DECODE_ATTENTIONS (not imported: it imports torch)
        choice("rollout.decode_attention", self.decode_attention, ("gqa", "sdpa"))
        # the names of mcgpo.rollout.vllm_launch.ENGINES (not imported: it imports vLLM)
        choice("rollout.engine", self.engine, ("hf", "vllm"))
        u = self.vllm_gpu_memory_utilization
        if not 0 <= u <= 1:
            raise ConfigError(
                f"rollout.vllm_gpu_memory_utilization must be in [0, 1] (0 = planned), got {u}"
            )
        # the names of mcgpo.rollout.vllm_launch.DTYPES (not imported: it imports vLLM)
        choice("rollout.vllm_dtype", self.vllm_dtype, ("auto", "bfloat16", "float32"))


@dataclass(frozen=True)
class AlgoConfig:
    name: str = option("mcgpo", "algorithm: an estimator name, mcgpo or graphgpo_shaping")
    lambda_pair: float = option(LAMBDA_PAIR, "weight of the MCGPO pair loss (mcgpo only)")
    shaping_coef: float = option(
        SHAPING_COEF, "progress-shaping coefficient (graphgpo_shaping only)"
    )
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
        at_least("algo.lambda_pair", self.lambda_pair, 0.0)
        at_least("algo.shaping_coef", self.shaping_coef, 0.0)


@dataclass(frozen=True)
class EvalConfig:
    every: int = option(5, "evaluate every k updates (and before the first and after the last)")
    tasks: int = option(128, "held-out tasks per evaluation")
    split: str = option("valid_seen", "split the held-out tasks come from")
    temperature: float = option(0.4, "sampling temperature for evaluation; 0 = greedy")

    def check(self) -> None:
        at_least("eval.every", self.every, 0)
        at_least("eval.tasks", self.tasks, 0)
        at_least("eval.temperature", self.temperature, 0.0)


@dataclass(frozen=True)
class SFTConfig:
    demos: int = option(200, "expert episodes (training tasks) used as demonstrations")
    epochs: int = option(2, "passes over the demonstration turns")
    noise: float = option(
        0.0, "chance of a random admissible action in the demo roll-in (expert labels all turns)"
    )
    lr: float = option(1e-3, "AdamW learning rate for the warm start")
    weight_decay: float = option(0.01, "AdamW weight decay for the warm start")
    grad_clip: float = option(1.0, "gradient-norm clip for the warm start; 0 = off")
    warmup: int = option(10, "steps of linear learning-rate warm-up")
    batch_size: int = option(32, "demonstration turns per optimiser step")
    micro_batch_size: int = option(
        8,
        "turns per forward/backward inside a step: the step's turns sorted by length and cut "
        "into micro-batches (less padding, same gradient); 0 = the whole step at once",
    )

    def check(self) -> None:
        at_least("sft.demos", self.demos, 1)
        at_least("sft.epochs", self.epochs, 1)
        if not 0.0 <= self.noise < 1.0:
            raise ConfigError(f"sft.noise must be in [0, 1), got {self.noise}")
        positive("sft.lr", self.lr)
        at_least("sft.weight_decay", self.weight_decay, 0.0)
        at_least("sft.grad_clip", self.grad_clip, 0.0)
        at_least("sft.warmup", self.warmup, 0)
        at_least("sft.batch_size", self.batch_size, 1)
        at_least("sft.micro_batch_size", self.micro_batch_size, 0)


@dataclass(frozen=True)
class RunConfig:
    model: str = option("tiny", "policy folder (save_pretrained), or 'tiny' for a fresh tiny model")
    corpus_episodes: int = option(
        256, "training episodes whose text trains the tiny model's tokenizer (model = 'tiny')"
    )
    out: str = option("runs/run", "run folder: config, metrics, checkpoints, final model")
    preset: str = option("", "preset name (mcgpo/presets) or path of a TOML file")
    device: str = option("cpu", "torch device: cpu or cuda")
    seed: int = option(0, "seed of everything (tasks, sampling, model init)")
    threads: int = option(0, "torch CPU threads; 0 = torch's default")
    deterministic: bool = option(False, "torch deterministic algorithms (bit-identical resume)")
    resume: bool = option(
        False,
        "continue the run in --out from its latest checkpoint; its config.toml is the base, "
        "so give only what changes (e.g. --train.updates)",
    )
    save_rollouts: bool = option(False, "save each update's StepTable as Parquet")
    tensorboard: bool = option(
        True, "write TensorBoard event files (false: as if report_to left tensorboard out)"
    )
    report_to: str = option(
        "tensorboard",
        "experiment trackers fed every metrics.jsonl record, comma-separated: tensorboard, "
        "wandb, mlflow, trackio, or none (as Hugging Face Trainer's --report_to; wandb, mlflow "
        "and trackio need the tracking extra); docs/training.md 'Tracking'",
    )
    progress: bool = option(True, "show a progress bar")
    nproc: int = option(
        1, "processes on this machine (world size; torchrun sets it); see scale-out.md"
    )
    backend: str = option("auto", "torch.distributed backend: auto (gloo on CPU, nccl on CUDA)")
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
        at_least("threads", self.threads, 0)
        at_least("nproc", self.nproc, 1)
        choice("backend", self.backend, ("auto", "gloo", "nccl"))
        at_least("corpus_episodes", self.corpus_episodes, 1)
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
        if self.train.async_lag and self.rollout.engine == "vllm" and self.rollout.vllm_sleep:
            raise ConfigError(
                f"train.async_lag {self.train.async_lag} needs rollout.vllm_sleep false: the "
                f"engine samples the next batch while the update runs, so it cannot sleep "
                f"through it"
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
