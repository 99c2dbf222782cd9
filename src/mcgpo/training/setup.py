"""Setup, kept apart from the loops: everything that builds objects.

:func:`prepare` is the one setup path of ``mcgpo train``, ``sft`` and ``eval``: typed
environment options, the run folder (created and checked writable), ``config.toml``, the
environment factory, runtime seeds and threads, the policy and its response format. Every
mistake a user can make there (a bad option, an environment that cannot be built, an
``--out`` that cannot be written) is reported as a :class:`ConfigError` before any model
work. :func:`setup_run` builds on it what only training needs: the algorithm's options,
resume, the frozen reference, the engine, the learner (DDP or FSDP2), AdamW and the metric
sinks. The loop in :mod:`mcgpo.training.trainer` only uses what it returns.

The parts live beside it: :mod:`~mcgpo.training.runtime` (device, threads, seeds, TF32),
:mod:`~mcgpo.training.run_folder` (``--out`` and the resume checks) and
:mod:`~mcgpo.training.build` (environments, policy, collect options, AdamW).

Seeds: every random choice derives from ``(seed, update)`` (rollout sampling, evaluation
sampling) or from the restored RNG state, so a stopped-and-resumed run equals the
uninterrupted one. Training tasks are consecutive task numbers from a cursor that the
checkpoint stores.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mcgpo.policy.dropout import base_dropout_off
from mcgpo.policy.lora import AdaptersOff
from mcgpo.training.build import (
    build_optimizer,
    env_factory,
    load_model,
    response_format_for,
    typed_env_options,
    wrap_lora,
)
from mcgpo.training.checkpoint import (
    Checkpoint,
    CheckpointError,
    kept_checkpoints,
    load_checkpoint,
    restore_rng,
)
from mcgpo.training.config import ConfigError, RunConfig
from mcgpo.training.distributed import (
    SINGLE,
    World,
    barrier,
    distributed_learner,
    distributed_reference,
    follow_learner,
    load_optimizer_state,
    sharded,
)
from mcgpo.training.engine import check_engine_installed, rollout_engine
from mcgpo.training.env_pools import RunPools
from mcgpo.training.metrics import MetricSinks, SilentSinks
from mcgpo.training.pending import Batch, read_pending
from mcgpo.training.presets import load_preset
from mcgpo.training.run_folder import (
    check_run_folder,
    check_sft_folder,
    stopped_before_a_checkpoint,
    writable_folder,
    write_run_config,
)
from mcgpo.training.run_lock import lock_run_folder
from mcgpo.training.runtime import apply_runtime, check_device
from mcgpo.training.tracking import check_trackers_installed

__all__ = ["KINDS", "Run", "RunSetup", "prepare", "setup_run"]

# The commands that share prepare(); "eval" writes no config.toml (its --out may be the
# folder of the run it evaluates).
KINDS = ("train", "sft", "eval")


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

    # frozen initial policy for the KL term (None when kl_coef == 0; with LoRA the policy
    # itself with its adapters off, mcgpo.policy.lora.AdaptersOff)
    ref_model: Any
    optimizer: torch.optim.Optimizer
    sinks: MetricSinks | SilentSinks  # SilentSinks on ranks other than 0
    updates_done: int  # updates completed
    task_cursor: int  # number of the next training task
    world: World = SINGLE  # this process's rank and the world size
    # what setup has to say (a damaged checkpoint passed over); the loop prints it
    notes: tuple[str, ...] = ()
    # what the update runs: ``model``; when W > 1 its DDP wrapper, or (train.sharding fsdp2)
    # a sharded copy whose steps ``model`` follows (a full replica for generation and saving),
    # or (train.fsdp_replica false) ``model`` itself sharded in place, which then only the
    # engine generates from
    learner: Any = None
    # rollout.engine vllm: the colocated engine serving ``model`` (None: mcgpo's samplers)
    engine: Any = None
    # train.async_lag >= 1: batches sampled ahead, restored from the checkpoint resumed
    # (mcgpo.training.pending), and the producer the loop starts (mcgpo.training.pipeline)
    pending: list[Any] = dataclasses.field(default_factory=list)
    rollouts: Any = None
    # the environment pools kept across rollouts, closed at the run's end (env_pools.py)
    env_pools: RunPools = dataclasses.field(default_factory=RunPools)

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
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
    check_device(cfg)
    cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, options=typed_env_options(cfg)))
    if kind == "train":
        from mcgpo.training.algorithms import resolve_algo

        cfg = dataclasses.replace(cfg, algo=resolve_algo(cfg.algo, cfg.rollout.group_size))
        check_run_folder(cfg)
    if kind == "sft":
        check_sft_folder(cfg)
    make_env = env_factory(cfg)
    folder = writable_folder(cfg.out)
    if kind != "eval" and world.main:  # one process writes a run folder at a time
        lock_run_folder(folder, command)
    barrier(world)  # every rank has checked the folder before rank 0 writes into it
    if kind != "eval" and world.main:
        write_run_config(folder, cfg, command)
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
    check_trackers_installed(cfg.trackers())
    setup = prepare(cfg, command, kind="train", world=world)
    cfg = setup.cfg = _resolve_auto(setup.cfg)
    model = setup.model
    lora = cfg.train.lora_rank > 0
    if lora:  # adapters on the base, which stays frozen (mcgpo.policy.lora)
        model = _with_lora(setup, world)
    ref_model = None
    if cfg.train.kl_coef > 0 and lora:  # the base: adapters off, no second copy
        ref_model = AdaptersOff(model)
    elif cfg.train.kl_coef > 0:  # the initial policy, also when resuming
        ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        ref_model = distributed_reference(
            ref_model, cfg.train.sharding, world, cfg.train.precision
        )  # FSDP2
    updates_done, cursor = 0, cfg.seed * 1_000_000
    state, notes, pending = None, [], []
    if cfg.resume and stopped_before_a_checkpoint(setup.folder):
        notes.append(
            "the run stopped before its first checkpoint: it starts again from update 0"
        )  # as a fresh run, with the saved settings; its records are written again
    elif cfg.resume:
        lora_model = model if lora else None  # LoRA: the checkpoint holds the adapters only
        state, model, pending, notes = _usable_checkpoint(cfg, setup.folder, world, lora_model)
        updates_done, cursor = state.update, state.task_cursor
    notes += _dropout_off(model)  # ratios compare whole networks (policy/dropout.py)
    if cfg.train.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False  # the sampler passes its own cache explicitly
    _check_compilable(cfg, model)
    engine = None
    if cfg.rollout.engine == "vllm":  # from the whole policy, before any sharding
        engine = rollout_engine(cfg, model, setup.tokenizer, setup.folder, world)
    replica = cfg.train.keep_replica(cfg.rollout.engine)
    learner = distributed_learner(
        model, cfg.train.sharding, world, replica=replica, precision=cfg.train.precision
    )
    optimizer = build_optimizer(learner, cfg.train.lr, cfg.train.weight_decay)
    if state is not None:
        load_optimizer_state(learner, optimizer, state.optimizer)
        restore_rng(state.rng)
    if replica:  # FSDP2: the sampler's replica follows the steps
        follow_learner(model, learner, optimizer)
    if isinstance(ref_model, AdaptersOff) and sharded(learner) and not replica:
        # LoRA sharded in place: the reference forward is the learner's (the FSDP2 root,
        # which gathers the shards), its adapters off
        ref_model = AdaptersOff(learner)
    sinks: MetricSinks | SilentSinks = SilentSinks()
    if world.main:
        sinks = MetricSinks(
            setup.folder,
            report_to=cfg.trackers(),
            resume_at=(-1 if state is None else updates_done) if cfg.resume else None,
            config=load_preset(str(setup.folder / "config.toml")),  # as written, code included
        )
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
        notes=tuple(notes),
        pending=pending,
    )


def _dropout_off(model: Any) -> list[str]:
    """The policy's dropout off for training; a note saying so when it had any."""
    dropout = base_dropout_off(model)
    if not dropout:
        return []
    rates = f"{len(dropout)} rate{'s' if len(dropout) > 1 else ''}"
    return [
        f"the policy's dropout is off for training ({rates} up to {max(dropout.values()):g} "
        "set to 0: PPO ratios and pi_old compare the whole network, as the sampler plays "
        "it; docs/reference/update.md)"
    ]


def _resolve_auto(cfg: RunConfig) -> RunConfig:
    """``train.old_logprobs`` and ``train.rollout_correction`` at ``auto``, resolved."""
    tempered = cfg.rollout.temperature != 1
    if (cfg.rollout.engine == "vllm" or tempered) and cfg.train.old_logprobs == "auto":
        # the engine's kernels are not the update's, or (tempered) the sampler's
        # log-probs are the sampling distribution's: pi_old from a training forward, and the
        # pi_old/* metrics measure the sampler against it
        cfg = dataclasses.replace(
            cfg, train=dataclasses.replace(cfg.train, old_logprobs="recompute")
        )
    if cfg.train.rollout_correction == "auto":  # tis where the engine's kernels differ
        train = dataclasses.replace(
            cfg.train, rollout_correction=cfg.train.correction(cfg.rollout.engine)
        )
        cfg = dataclasses.replace(cfg, train=train)
    return cfg


def _with_lora(setup: RunSetup, world: World) -> Any:
    """``setup.model`` with the run's LoRA adapters (``train.lora_*``). The adapter folders
    name their base model's folder: ``--model``'s, or for the tiny model (built, not
    loaded) ``<out>/base``, which rank 0 writes once."""
    from mcgpo.policy import save_policy

    cfg = setup.cfg
    base: Path | str = cfg.model
    if cfg.model == "tiny":
        base = setup.folder / "base"
        if world.main and not (base / "config.json").is_file():
            save_policy(setup.model, setup.tokenizer, base)
        barrier(world)
    model = wrap_lora(cfg, setup.model, base)
    in_place = cfg.train.sharding == "fsdp2" and not cfg.train.keep_replica(cfg.rollout.engine)
    if world.size > 1 and in_place:  # the engine's merged weights come from the shards
        from mcgpo.policy.lora import non_linear_adapters

        others = non_linear_adapters(model)
        if others:
            raise ConfigError(
                f"train.lora_targets: {others[0]} is not a linear layer; with train.sharding "
                "fsdp2 and train.fsdp_replica false (the default with vLLM) the adapters "
                "merge from the shards for linear layers only: target linear layers or set "
                "--train.fsdp_replica true"
            )
    return model


def _load_adapters(model: Any, path: Path) -> None:
    from mcgpo.policy.lora import LoraError, load_adapter_state

    try:
        load_adapter_state(model, path)
    except LoraError as err:
        raise ConfigError(f"resume: {err}") from None


def _usable_checkpoint(
    cfg: RunConfig, folder: Path, world: World, lora_model: Any = None
) -> tuple[Checkpoint, Any, list[Batch], list[str]]:
    """The newest kept checkpoint that loads (its trainer state, model and this rank's
    pending batches), and a note for each newer one passed over as damaged; a ConfigError
    naming them if none loads. ``lora_model``: the run's LoRA policy, whose adapters are
    set from the checkpoint (its model folder holds them only) and which is returned."""
    notes: list[str] = []
    for path in kept_checkpoints(folder):
        try:
            state = load_checkpoint(path)
            if lora_model is not None:
                _load_adapters(lora_model, state.model_path)
                model = lora_model
            else:
                model, _ = load_model(cfg, state.model_path)
            pending = read_pending(state.path, cfg.train.async_lag, world.rank, world.size)
        except (CheckpointError, ConfigError) as err:
            notes.append(str(err))
            continue
        if notes:
            notes.append(f"resuming from the previous kept checkpoint, {path.name}")
        return state, model, pending, notes
    raise ConfigError(f"--resume: no usable checkpoint in {str(folder)!r}: " + "; ".join(notes))


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
