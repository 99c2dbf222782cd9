"""What a run says on stderr before its first long step: the run in one line (``mcgpo train``,
``sft`` and ``eval`` alike: what runs, on what, how big, where it writes), and a word when a
CPU is about to run a recipe sized for GPUs. The commands print them; nothing here prints."""

from __future__ import annotations

from mcgpo.training.config import RunConfig

__all__ = [
    "CPU_EPISODES",
    "cpu_size_note",
    "eval_start_line",
    "sft_start_line",
    "train_start_line",
]

# Training episodes above which a run on the CPU gets a note: household-quick's 12 updates of
# 16 x 8 (1,536 episodes, minutes with the tiny model) stay under it; the defaults' 150
# updates (19,200 episodes, hours) do not.
CPU_EPISODES = 5_000


def train_start_line(cfg: RunConfig, updates_done: int = 0) -> str:
    """``[train] mcgpo on household: 150 updates of 16x8 rollouts, ...``."""
    start = f"{cfg.train.updates} updates"
    start = f"resuming after update {updates_done}, up to {start}" if cfg.resume else start
    every = f"every {cfg.eval.every} updates" if cfg.eval.every else "before and after"
    evaluation = f"eval on {cfg.eval.tasks} held-out tasks {every}" if cfg.eval.tasks else "no eval"
    return (
        f"[train] {cfg.algo.name} on {cfg.env.name}: {start} of {cfg.rollout.groups}x"
        f"{cfg.rollout.group_size} rollouts, {evaluation}; model {cfg.model} on {cfg.device}; "
        f"run folder {cfg.out}"
    )


def sft_start_line(cfg: RunConfig) -> str:
    """``[sft] warm start of tiny on household: 400 expert episodes, 2 epochs, ...``."""
    return (
        f"[sft] warm start of {cfg.model} on {cfg.env.name}: {cfg.sft.demos} expert "
        f"episodes, {cfg.sft.epochs} epochs, eval on {cfg.eval.tasks} held-out tasks before "
        f"and after; run folder {cfg.out}"
    )


def eval_start_line(cfg: RunConfig) -> str:
    """``[eval] runs/hq/model on household: 64 held-out tasks of valid_seen at T=0.4, ...``."""
    return (
        f"[eval] {cfg.model} on {cfg.env.name}: {cfg.eval.tasks} held-out tasks of "
        f"{cfg.eval.split} at T={cfg.eval.temperature}, {cfg.device}; eval.json -> {cfg.out}"
    )


def cpu_size_note(cfg: RunConfig, updates_done: int = 0) -> str | None:
    """A line for a CPU run of more than :data:`CPU_EPISODES` training episodes, naming the
    smaller presets; None otherwise."""
    if cfg.device != "cpu":
        return None
    updates = max(cfg.train.updates - updates_done, 0)
    episodes = updates * cfg.rollout.groups * cfg.rollout.group_size
    if episodes <= CPU_EPISODES:
        return None
    return (
        f"[train] note: {updates} updates of {cfg.rollout.groups}x{cfg.rollout.group_size} "
        f"rollouts ({episodes:,} episodes) on the CPU take hours; for a first run pick a "
        f"smaller preset: --preset household-smoke (seconds) or --preset household-quick "
        f"(minutes); `mcgpo presets` lists them (Ctrl-C stops this one)"
    )
