"""Setup, kept apart from the loops: everything that builds objects.

:func:`prepare` is the one setup path of ``mcgpo train``, ``sft`` and ``eval``: typed
environment options, the run folder (created and checked writable), ``config.toml``, the
environment factory, runtime seeds and threads, the policy and its response format. Every
mistake a user can make there (a bad option, an environment that cannot be built, an
``--out`` that cannot be written) is reported as a :class:`ConfigError` before any model
work. :func:`setup_run` builds on it what only training needs: the algorithm's options,
resume, the frozen reference, AdamW and the metric sinks. The loop in
:mod:`mcgpo.training.trainer` only uses what it returns.

Seeds: every random choice derives from ``(seed, update)`` (rollout sampling, evaluation
sampling) or from the restored RNG state, so a stopped-and-resumed run equals the
uninterrupted one. Training tasks are consecutive task numbers from a cursor that the
checkpoint stores.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mcgpo.rollout.group_rollout import CollectOptions
from mcgpo.training.checkpoint import (
    atomic_write_text,
    latest_checkpoint,
    load_checkpoint,
    restore_rng,
)
from mcgpo.training.config import ConfigError, RunConfig
from mcgpo.training.config_layout import flatten, from_dict, parse_scalar
from mcgpo.training.distributed import (
    SINGLE,
    World,
    barrier,
    distributed_learner,
    distributed_reference,
    follow_learner,
    load_optimizer_state,
)
from mcgpo.training.engine import check_engine_installed, rollout_engine
from mcgpo.training.metrics import MetricSinks, SilentSinks

__all__ = [
    "KINDS",
    "Run",
    "RunSetup",
    "apply_runtime",
    "build_optimizer",
    "check_device",
    "collect_options",
    "env_factory",
    "load_model",
    "prepare",
    "response_format_for",
    "rollout_seed",
    "setup_run",
    "tiny_corpus",
    "writable_folder",
]

# The commands that share prepare(); "eval" writes no config.toml (its --out may be the
# folder of the run it evaluates).
KINDS = ("train", "sft", "eval")

# Settings that may change when a run is resumed; anything else must match the saved config.
RESUMABLE = {
    "resume",
    "preset",
    "progress",
    "tensorboard",
    "save_rollouts",
    "threads",
    "device",
    "train.updates",
    "train.save_every",
    "env.workers",  # where the environments step never changes the rollouts
    "env.step_timeout",
    "train.old_logprobs_check",  # measures the pi_old mismatch, never changes the update
    "rollout.vllm_gpu_memory_utilization",  # the engine's memory, never its samples
    "train.compile",  # compiled or eager layers: the same maths, float rounding apart
}


@dataclass
class RunSetup:
    """What every command works with; built by :func:`prepare`."""

    cfg: RunConfig  # env options typed; for train also the algorithm's options filled in
    folder: Path  # the --out folder, created and writable
    make_env: Callable[[], Any]  # a fresh environment of the run per call
    model: Any
    tokenizer: Any
    response_format: str  # rollout.response_format with "auto" resolved from the tokenizer


@dataclass
class Run(RunSetup):
    """What the training loop works with. ``updates_done`` and ``task_cursor`` advance."""

    ref_model: Any  # frozen initial policy for the KL term (None when kl_coef == 0)
    optimizer: torch.optim.Optimizer
    sinks: MetricSinks | SilentSinks  # SilentSinks on ranks other than 0
    updates_done: int  # updates completed
    task_cursor: int  # number of the next training task
    world: World = SINGLE  # this process's rank and the world size
    # what the update runs: ``model``; when W > 1 its DDP wrapper, or (train.sharding fsdp2)
    # a sharded copy whose steps ``model`` follows (a full replica for generation and saving),
    # or (train.fsdp_replica false) ``model`` itself sharded in place, which then only the
    # engine generates from
    learner: Any = None
    # rollout.engine vllm: the colocated engine serving ``model`` (None: mcgpo's samplers)
    engine: Any = None

    def __post_init__(self) -> None:
        if self.learner is None:
            self.learner = self.model


def prepare(cfg: RunConfig, command: str = "", *, kind: str, world: World = SINGLE) -> RunSetup:
    """The setup shared by ``mcgpo train`` / ``sft`` / ``eval`` (``kind``), in that order:

    typed env options (train: and the algorithm's options, then the run-folder checks of
    :func:`setup_run`), the environment factory (builds one environment), the ``--out``
    folder (created, checked writable), ``config.toml`` (train and sft), runtime, policy.
    With several processes (``world``) every rank checks the folder before rank 0 writes.
    """
    from mcgpo.training.presets import to_toml

    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
    check_device(cfg)
    cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, options=typed_env_options(cfg)))
    if kind == "train":
        from mcgpo.training.algorithms import resolve_algo

        cfg = dataclasses.replace(cfg, algo=resolve_algo(cfg.algo, cfg.rollout.group_size))
        _check_run_folder(cfg)
    make_env = env_factory(cfg)
    folder = writable_folder(cfg.out)
    barrier(world)  # every rank has checked the folder before rank 0 writes into it
    if kind != "eval" and world.main:
        atomic_write_text(folder / "config.toml", to_toml(cfg, command))
    apply_runtime(cfg)
    model, tokenizer = load_model(cfg, make_env=make_env)
    return RunSetup(
        cfg=cfg,
        folder=folder,
        make_env=make_env,
        model=model,
        tokenizer=tokenizer,
        response_format=response_format_for(cfg, tokenizer),
    )


def setup_run(cfg: RunConfig, command: str = "", world: World = SINGLE) -> Run:
    """Everything the training loop needs; a fresh run or the resumed one in ``cfg.out``.

    With W > 1 processes (``world``) every rank builds the same model from the same seed (or
    loads the same checkpoint); the ``learner`` is its DDP wrapper or, with
    ``train.sharding = "fsdp2"``, an FSDP2-sharded copy that AdamW steps and ``model``
    follows (:mod:`mcgpo.training.distributed`); only rank 0 writes metrics."""
    if cfg.rollout.engine == "vllm":
        check_engine_installed()  # before any model work
    setup = prepare(cfg, command, kind="train", world=world)
    cfg, model = setup.cfg, setup.model
    if cfg.rollout.engine == "vllm" and cfg.train.old_logprobs == "auto":
        # the engine's kernels are not the update's: pi_old from a training forward, and the
        # pi_old/* metrics measure the engine against it
        cfg = dataclasses.replace(
            cfg, train=dataclasses.replace(cfg.train, old_logprobs="recompute")
        )
        setup.cfg = cfg
    if cfg.train.rollout_correction == "auto":  # tis where the engine's kernels differ
        train = dataclasses.replace(
            cfg.train, rollout_correction=cfg.train.correction(cfg.rollout.engine)
        )
        cfg = setup.cfg = dataclasses.replace(cfg, train=train)
    ref_model = None
    if cfg.train.kl_coef > 0:  # the initial policy, also when resuming
        ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        ref_model = distributed_reference(ref_model, cfg.train.sharding, world)  # FSDP2
    updates_done, cursor = 0, cfg.seed * 1_000_000
    checkpoint = latest_checkpoint(setup.folder) if cfg.resume else None
    state = load_checkpoint(checkpoint) if checkpoint is not None else None
    if state is not None:
        model, _ = load_model(cfg, state.model_path)
        updates_done, cursor = state.update, state.task_cursor
    if cfg.train.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False  # the sampler passes its own cache explicitly
    _check_compilable(cfg, model)
    engine = None
    if cfg.rollout.engine == "vllm":  # from the whole policy, before any sharding
        engine = rollout_engine(cfg, model, setup.tokenizer, setup.folder, world)
    replica = cfg.train.keep_replica(cfg.rollout.engine)
    learner = distributed_learner(model, cfg.train.sharding, world, replica=replica)
    optimizer = build_optimizer(learner, cfg.train.lr, cfg.train.weight_decay)
    if state is not None:
        load_optimizer_state(learner, optimizer, state.optimizer)
        restore_rng(state.rng)
    if replica:  # FSDP2: the sampler's replica follows the steps
        follow_learner(model, learner, optimizer)
    sinks: MetricSinks | SilentSinks = SilentSinks()
    if world.main:
        resume_at = updates_done if cfg.resume else None
        sinks = MetricSinks(setup.folder, tensorboard=cfg.tensorboard, resume_at=resume_at)
    fields = {f.name: getattr(setup, f.name) for f in dataclasses.fields(RunSetup)}
    return Run(
        **{**fields, "model": model},
        ref_model=ref_model,
        optimizer=optimizer,
        sinks=sinks,
        updates_done=updates_done,
        task_cursor=cursor,
        world=world,
        learner=learner,
        engine=engine,
    )


def _check_compilable(cfg: RunConfig, model: Any) -> None:
    """``train.compile`` on (true, or auto on CUDA) needs decoder layers it can find and, on
    the CPU, a C++ compiler (:func:`mcgpo.policy.compile.check_compilable`)."""
    from mcgpo.policy.compile import check_compilable, compile_enabled

    if not compile_enabled(cfg.train.compile, cfg.device):
        return
    try:
        check_compilable(model, cfg.device)
    except ValueError as err:
        raise ConfigError(
            f"train.compile {cfg.train.compile}: {err}; use --train.compile false"
        ) from None


def writable_folder(path: str | Path) -> Path:
    """``path`` as a folder that exists and can be written; else a one-line ConfigError."""
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError(f"--out {str(folder)!r} exists and is not a folder") from None
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise ConfigError(f"--out {str(folder)!r}: cannot create the folder ({reason})") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {str(folder)!r}: the folder is not writable")
    return folder


def check_device(cfg: RunConfig) -> None:
    """``cfg.device`` exists here and can run ``train.precision``; else a one-line ConfigError."""
    from mcgpo.policy.precision import PrecisionError, check_precision

    if cfg.device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {cfg.device}: CUDA is not available on this machine")
        index = torch.device(cfg.device).index
        if index is not None and index >= torch.cuda.device_count():
            raise ConfigError(
                f"--device {cfg.device}: this machine has {torch.cuda.device_count()} CUDA "
                "device(s)"
            )
    try:
        check_precision(cfg.train.precision, cfg.device)
    except PrecisionError as err:
        raise ConfigError(str(err)) from None


def apply_runtime(cfg: RunConfig) -> None:
    """Threads, determinism, TF32 on CUDA (``train.tf32``) and the global seeds."""
    if cfg.device.startswith("cuda"):
        _set_tf32(cfg.train.tf32)
    if cfg.threads:
        torch.set_num_threads(process_threads(cfg.threads))
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed % 2**32)
    torch.manual_seed(cfg.seed)


def process_threads(threads: int, local_world: int | None = None, cores: int | None = None) -> int:
    """Torch threads of this process: ``threads``, capped so that the processes launched on
    this machine (``LOCAL_WORLD_SIZE``, set by torchrun and ``--nproc``) use at most its
    cores together (never below 1). Two processes with a preset's 2 threads each on a
    2-core machine made the sampler's many small operations about 10 times slower
    (OpenMP threads spinning against each other)."""
    if local_world is None:
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    cores = cores or os.cpu_count() or 1
    if local_world <= 1:
        return threads
    return max(1, min(threads, cores // local_world))


def load_model(
    cfg: RunConfig,
    path: str | Path | None = None,
    *,
    make_env: Callable[[], Any] | None = None,
) -> tuple[Any, Any]:
    """The policy of ``cfg.model`` (or ``path``) on ``cfg.device``: a folder, or 'tiny'.

    ``make_env``: the run's environment factory (default ``env_factory(cfg)``); for 'tiny'
    the tokenizer learns the text of the environment as configured (its sizes, its game
    cache), from ``cfg.corpus_episodes`` expert-led training episodes."""
    from mcgpo.policy import build_tiny_policy, load_policy
    from mcgpo.policy.loading import PolicyLoadError

    source = str(path or cfg.model)
    if source == "tiny":
        texts = tiny_corpus(cfg, make_env or env_factory(cfg))
        model, tokenizer = build_tiny_policy(texts, seed=cfg.seed)
    else:
        try:
            model, tokenizer = load_policy(source)
        except PolicyLoadError as err:
            raise ConfigError(str(err)) from None
    from mcgpo.policy.precision import cast_weights

    return cast_weights(model, cfg.train.precision).to(cfg.device), tokenizer


def tiny_corpus(cfg: RunConfig, make_env: Callable[[], Any]) -> Iterable[str]:
    """The tiny tokenizer's corpus: ``cfg.corpus_episodes`` episodes of the run's environment."""
    from mcgpo.rollout.corpus import environment_corpus

    return environment_corpus(
        (cfg.env.name,), episodes=cfg.corpus_episodes, seed=cfg.seed, make=lambda _: make_env()
    )


def env_factory(cfg: RunConfig) -> Callable[[], Any]:
    """A no-argument factory of fresh environments of ``cfg.env.name``; picklable
    (:class:`~mcgpo.envs.workers.EnvSpec`), so that worker processes can build them too."""
    from mcgpo.envs.workers import EnvSpec

    name = cfg.env.name
    make = EnvSpec(name, typed_env_options(cfg))
    try:
        make()  # a bad name or option, or a missing extra, is reported before any model work
    except (ValueError, TypeError, ImportError) as err:
        raise ConfigError(f"env {name!r}: {str(err).splitlines()[0]}") from None
    return make


def typed_env_options(cfg: RunConfig) -> dict[str, Any]:
    """Environment options with command-line strings read as TOML would (12 -> int)."""
    return {k: parse_scalar(v) if isinstance(v, str) else v for k, v in cfg.env.options.items()}


def response_format_for(cfg: RunConfig, tokenizer: Any) -> str:
    """``rollout.response_format``, with ``auto`` resolved from the tokenizer."""
    from mcgpo.rollout.prompts import default_response_format

    fmt = cfg.rollout.response_format
    return default_response_format(tokenizer) if fmt == "auto" else fmt


def collect_options(
    cfg: RunConfig,
    response_format: str,
    *,
    split: str,
    temperature: float,
    group_size: int,
    seed: int,
) -> CollectOptions:
    """The options of :func:`mcgpo.rollout.collect` for a run: turn limit, response and
    prompt budgets, history and environment workers from ``cfg``; split, temperature, group
    size and seed differ between training rollouts and evaluation, so the caller names them."""
    return CollectOptions(
        group_size=group_size,
        split=split,
        temperature=temperature,
        max_turns=cfg.env.max_turns or None,
        max_new_tokens=cfg.rollout.max_new_tokens,
        history=cfg.rollout.history,
        response_format=response_format,
        seed=seed,
        max_prompt_tokens=cfg.rollout.max_prompt_tokens,
        workers=cfg.env.workers,
        step_timeout=cfg.env.step_timeout,
        sampler=cfg.rollout.sampler,
        decode_attention=cfg.rollout.decode_attention,
    )


def build_optimizer(model: Any, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters (decay on all of them, as verl's FSDP actor)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


def _set_tf32(enabled: bool) -> None:
    """TF32 for float32 matmuls and convolutions on CUDA (torch >= 2.9 API, else the old)."""
    mode = "tf32" if enabled else "ieee"
    matmul = torch.backends.cuda.matmul
    if hasattr(torch.backends, "fp32_precision"):  # mixing it with allow_tf32 is an error
        matmul.fp32_precision = mode
        torch.backends.cudnn.conv.fp32_precision = mode
    else:
        matmul.allow_tf32 = enabled
        torch.backends.cudnn.allow_tf32 = enabled


def rollout_seed(seed: int, update: int) -> int:
    """The sampling seed of the rollouts of ``update`` (1-based) in a run with ``seed``."""
    return int(np.random.SeedSequence([seed, update]).generate_state(1)[0])


def _check_run_folder(cfg: RunConfig) -> None:
    """A fresh run needs a folder without a run; a resumed one its checkpoint and settings."""
    folder = Path(cfg.out)
    checkpoint = latest_checkpoint(folder)
    if cfg.resume:
        if checkpoint is None:
            raise ConfigError(f"--resume: no checkpoint in {str(folder)!r}")
        _check_same_run(folder / "config.toml", cfg)
    elif checkpoint is not None or (folder / "metrics.jsonl").exists():
        raise ConfigError(
            f"run folder {str(folder)!r} already holds a run; use --resume or another --out"
        )


def _check_same_run(saved_path: Path, cfg: RunConfig) -> None:
    """A resumed run must use the saved settings, except the few in RESUMABLE."""
    from mcgpo.training.presets import load_preset

    if not saved_path.is_file():
        raise ConfigError(f"--resume: {str(saved_path)!r} is missing")
    saved = flatten(from_dict(load_preset(str(saved_path))))
    now = flatten(cfg)
    for key in sorted(set(saved) | set(now)):
        if key in RESUMABLE:
            continue
        if saved.get(key) != now.get(key):
            raise ConfigError(
                f"--resume: {key} is {now.get(key)!r} but the run was started with "
                f"{saved.get(key)!r}"
            )
