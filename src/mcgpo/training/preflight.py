"""What ``mcgpo sft | train | eval`` checks between reading its command line and starting the
run (:func:`preflight`), before torch or transformers is imported, so that each mistake is one
line in a fraction of a second:

* the environment, name and options: one is built (:func:`~mcgpo.training.environments.
  env_factory`, as ``mcgpo bench`` checks its runs' and the run builds its own; the built-in
  environments are free of torch), so that ``--env.max_turn 5`` is one line with the
  closest option at once; the model folder (a hub id gets the command that downloads it)
  and, for ``--device cuda``, CUDA;
* ``train``: the algorithm's options and the run folder (a fresh run needs one without a run,
  ``--resume`` its checkpoint and settings), as :func:`mcgpo.training.setup.prepare` checks
  them again; ``sft``: a folder without a run (it is never overwritten);
* ``eval`` of a run trained on a GPU, here without CUDA: the device came from the run's
  config.toml, not from ``--device``, so the evaluation runs on the CPU, in one process
  (the run's ``nproc``) with the HF sampler (its ``rollout.engine``), with a note naming
  each change; what the command line gives is kept.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from mcgpo.model_names import hub_id_hint
from mcgpo.training.algorithms import resolve_algo
from mcgpo.training.config import ConfigError, RunConfig
from mcgpo.training.environments import env_factory
from mcgpo.training.overrides import eval_run_folder, parse_flags
from mcgpo.training.run_folder import check_run_folder, check_sft_folder

__all__ = ["check_environment", "preflight"]


def preflight(command: str, cfg: RunConfig, argv: Sequence[str]) -> tuple[RunConfig, str | None]:
    """The config ``mcgpo <command> <argv>`` runs with (``cfg``: as resolved from them) and a
    note for the console, or None; a mistake is a one-line ConfigError."""
    if command == "eval" and parse_flags(command, argv).values.get("rollout.engine") == "vllm":
        raise ConfigError(
            "--rollout.engine vllm: mcgpo eval samples with mcgpo's HF sampler (the engine "
            "serves mcgpo train's rollouts, docs/rollout.md section 9): drop the option"
        )
    cfg, note = _device_here(command, cfg, argv)
    check_environment(cfg)
    if command == "train":
        algo = resolve_algo(cfg.algo, cfg.rollout.group_size)
        check_run_folder(dataclasses.replace(cfg, algo=algo))
    if command == "sft":
        check_sft_folder(cfg)
    return cfg, note


def check_environment(cfg: RunConfig) -> None:
    """Things a config cannot know by itself: the environment exists and takes its options
    (one is built, as the run builds its own), the model folder and the device exist."""
    env_factory(cfg)  # a bad name or option is one ConfigError line: "env 'household': ..."
    if cfg.model != "tiny" and not Path(cfg.model).is_dir():
        hint = hub_id_hint(cfg.model) or " (give a folder or 'tiny')"
        raise ConfigError(f"model folder {cfg.model!r} not found{hint}")
    if cfg.device.startswith("cuda"):
        import torch  # only for a CUDA device: the run that follows needs it anyway

        if not torch.cuda.is_available():
            raise ConfigError(f"--device {cfg.device}: CUDA is not available on this machine")


def _device_here(command: str, cfg: RunConfig, argv: Sequence[str]) -> tuple[RunConfig, str | None]:
    """``eval`` of a run trained on CUDA, on a machine without it: one process on the CPU with
    mcgpo's HF sampler, and a note naming what changed. What the command line gives stays:
    ``--device`` (then :func:`check_environment` says CUDA is missing), ``--nproc`` (gloo
    processes on the CPU; so do the processes a launcher such as torchrun started);
    ``--backend nccl`` cannot run on the CPU and is refused in one line (so is ``--rollout.
    engine vllm`` anywhere: :func:`preflight`)."""
    if command != "eval" or not cfg.device.startswith("cuda"):
        return cfg, None
    flags = parse_flags(command, argv)
    if "device" in flags.values or eval_run_folder(flags) is None:
        return cfg, None
    import torch

    if torch.cuda.is_available():
        return cfg, None
    given = flags.values
    if given.get("backend") == "nccl":
        raise ConfigError(
            f"--backend nccl: the run trained on {cfg.device}, and CUDA is not available on "
            "this machine, so it is evaluated on the CPU: pass --backend gloo (or drop it)"
        )
    trained, doing, passed = [], ["on the CPU"], ["--device cpu"]
    nproc, backend = cfg.nproc, cfg.backend
    from mcgpo.training.distributed import launched_world_size  # torch is loaded by now

    if nproc > 1 and "nproc" not in given and launched_world_size() == 1:  # not torchrun's
        trained.append(f"{nproc} processes")
        doing.insert(0, "in one process")
        passed.append("--nproc 1")
        nproc = 1
    if backend == "nccl" and "backend" not in given:  # NCCL needs CUDA, even for 1 process
        passed.append("--backend auto")
        backend = "auto"
    rollout = cfg.rollout
    if rollout.engine == "vllm" and "rollout.engine" not in given:
        trained.append("rollout.engine vllm")
        doing.append("with mcgpo's HF sampler")
        passed.append("--rollout.engine hf")
        rollout = dataclasses.replace(rollout, engine="hf")
    setting = f" with {' and '.join(trained)}" if trained else ""
    note = (
        f"the run trained on {cfg.device}{setting}, and CUDA is not available on this machine: "
        f"evaluating {' '.join(doing)} ({' '.join(passed)})"
    )
    here = dataclasses.replace(cfg, device="cpu", nproc=nproc, backend=backend, rollout=rollout)
    return here, note
