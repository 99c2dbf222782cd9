"""The training loop: collect, credit, update, log; evaluate and checkpoint every k updates.

This file reads top to bottom. Everything that builds objects (model, reference,
optimiser, environments, run folder, resume) is in :mod:`mcgpo.training.setup`; the maths
is in the estimators, :mod:`mcgpo.preferences` and :mod:`mcgpo.training.update`. The
single-process CPU path here is the reference implementation: ``breakpoint()`` works
anywhere in the loop.

One update (reference/algorithms.md 1.4):

1. collect ``G x N`` rollouts on the next ``G`` training tasks (task cursor), sampling at
   ``rollout.temperature`` with the sampler's log-probs kept as pi_old (``rollout.engine``
   vllm: a colocated vLLM engine samples, and gets the new weights after step 3; with
   ``train.async_lag`` >= 1 the rollout producer loads them, between its batches);
2. drop the trajectories that hit an environment error (kept in the logs and the saved
   rollouts, excluded from learning), then advantages and, for MCGPO, preference pairs; an
   update whose every trajectory errored is a warning line naming the first error, and
   ``train.max_failed_updates`` of them in a row stop the run (:class:`TrainingStopped`; the
   last checkpoint, never one of those updates, is where ``--resume`` goes on);
3. the PPO update, with the pair loss inside the same micro-batch passes;
4. log to ``metrics.jsonl``/TensorBoard, optionally save the StepTable as Parquet;
5. every ``eval.every`` updates: greedy-ish (T=0.4) episodes on held-out tasks; every
   ``train.save_every`` updates: an atomic checkpoint.

Under FSDP2 without a replica (``train.fsdp_replica false``, the default with vLLM) the
policy ``run.model`` is sharded over the ranks: the engine also plays the evaluation
episodes, and saving first gathers the weights to rank 0 (a collective of every rank).
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any

import numpy as np
from tqdm import tqdm

from mcgpo.rollout.group_rollout import Rollout
from mcgpo.training.algorithms import Credit, assign_credit
from mcgpo.training.checkpoint import save_checkpoint
from mcgpo.training.config import RunConfig
from mcgpo.training.distributed import (
    barrier,
    full_model_state,
    full_optimizer_state,
    gather_objects,
    joined_world,
    merge_metrics,
    whole_batch_algo,
)
from mcgpo.training.evaluate import evaluate
from mcgpo.training.metrics import ProgressBar, Table, read_metrics
from mcgpo.training.pipeline import collect_batch, evaluates_on_engine, start_pipeline
from mcgpo.training.setup import Run, setup_run
from mcgpo.training.start_lines import cpu_size_note, train_start_line
from mcgpo.training.update import PairBatch, update_policy

__all__ = ["TrainingStopped", "train"]


class TrainingStopped(RuntimeError):
    """The run stopped before its last update (one line: why, and how to go on)."""


def train(cfg: RunConfig, command: str = "") -> Table:
    """Run (or resume) training as configured; return the before/after evaluation table.

    The Python form of ``mcgpo train`` (``mcgpo.train``), with the same config objects::

        cfg = mcgpo.load_config("household-smoke", **{"out": "runs/a", "train.lr": 1e-3})
        print(mcgpo.train(cfg).render())
        # go on to 4 updates: the run folder's config.toml as the preset
        mcgpo.train(mcgpo.load_config("runs/a/config.toml", resume=True, **{"train.updates": 4}))

    Everything the run writes is in ``cfg.out`` (``metrics.jsonl``, checkpoints, ``model/``,
    ``config.toml``); ``command`` is recorded as its first line. A bad setting, model folder
    or run folder raises :class:`~mcgpo.training.config.ConfigError` (one line) before any
    model work.

    Under torchrun (W > 1 processes) each rank plays its block of whole groups and the
    update is DDP (:mod:`mcgpo.training.distributed`); rank 0 writes every file.
    """
    with joined_world(cfg) as (cfg, world):
        run = setup_run(cfg, command, world)
        if world.main:  # the run is checked and built: say what comes
            warnings = (f"[train] warning: {note}" for note in run.notes)
            _say(
                train_start_line(run.cfg, run.updates_done),
                *warnings,
                cpu_size_note(run.cfg, run.updates_done),
            )
        try:
            return _train(run)
        finally:
            if run.rollouts is not None:
                run.rollouts.close()
            run.env_pools.close()  # the kept environment pools' worker processes
            if run.engine is not None:
                run.engine.close()


def _train(run: Run) -> Table:
    cfg, world = run.cfg, run.world
    if run.updates_done == 0:
        if world.main and cfg.eval.tasks:
            _say(f"[train] evaluating the policy before training ({cfg.eval.tasks} tasks)")
        _evaluate(run)  # the "before" column of the final table
    bar = ProgressBar(cfg.train.updates, run.updates_done, enabled=cfg.progress and world.main)
    run.rollouts = start_pipeline(run)  # train.async_lag >= 1: batches sampled ahead
    failed_in_a_row, saved_at = 0, run.updates_done  # saved_at: the last checkpoint's update
    while run.updates_done < cfg.train.updates:
        update = run.updates_done + 1
        clock = time.perf_counter()

        # 1. Collect G x N rollouts on the next G training tasks (this rank's block of them).
        rollout, stats = _collect(run, update)
        t_rollout = time.perf_counter() - clock

        # 2. Credit on the learnable rows only (errored trajectories are excluded).
        clock = time.perf_counter()
        learnable = rollout.learnable()
        algo = whole_batch_algo(cfg.algo, learnable.table, world)  # W > 1: batch-wide counts
        credit = assign_credit(learnable.table, algo)
        t_credit = time.perf_counter() - clock

        # 3. The PPO update, the pair loss in the same micro-batch passes.
        clock = time.perf_counter()
        if run.engine is not None:
            run.engine.sleep()  # frees the engine's GPU memory if rollout.vllm_sleep
        stats |= update_policy(
            run.learner,
            run.optimizer,
            learnable.tokens,
            credit.advantages,
            cfg.train,
            pairs=PairBatch(credit.plus, credit.minus, credit.weight),
            lambda_pair=cfg.algo.lambda_pair,
            ref_model=run.ref_model,
            groups=learnable.table.group,  # mini-batches of whole task groups
            world=world,
        )
        t_update = time.perf_counter() - clock
        run.updates_done = update
        if run.rollouts is not None:  # the producer may sample with theta_update from now on
            run.rollouts.publish()
        times = {"time/rollout": t_rollout, "time/credit": t_credit, "time/update": t_update}
        if run.engine is not None and run.rollouts is None:  # the engine serves the new
            # weights from the next rollout (train.async_lag >= 1: the producer loads them)
            times["time/weight_sync"] = run.engine.update_weights(run.model)

        # 4. Log.
        metrics = merge_metrics(
            gather_objects(_update_metrics(rollout, credit, stats, times), world)
        )
        run.sinks.write(update, metrics)
        if cfg.save_rollouts:
            _save_rollouts(run, update, rollout, credit)
        bar.show(success=metrics["rollout/success_rate"])
        failed = _learned_nothing(run, update, rollout, metrics)  # a warning line if so
        failed_in_a_row = failed_in_a_row + 1 if failed else 0
        if failed_in_a_row >= cfg.train.max_failed_updates:
            bar.close()
            run.sinks.close()
            raise TrainingStopped(_stop_message(failed_in_a_row, update, saved_at, rollout))

        # 5. Evaluate and checkpoint (always after the last update).
        last = update == cfg.train.updates
        if last or (cfg.eval.every and update % cfg.eval.every == 0):
            bar.show(eval=_evaluate(run).get("eval/success", float("nan")))
        if not failed and (last or (cfg.train.save_every and update % cfg.train.save_every == 0)):
            _checkpoint(run)  # never an update that learned nothing: --resume plays it again
            saved_at = update
        bar.advance()
    bar.close()
    weights = full_model_state(run.model)  # sharded in place: gathered to rank 0
    if world.main:
        _save_final_model(run, weights)
        _say(_no_signal_note(run))  # a run that learned nothing says so
    barrier(world)
    run.sinks.close()
    return _summary(run)


def _say(*lines: str | None) -> None:
    """Print the lines that are not None on stderr (the run's own messages)."""
    for line in lines:
        if line is not None:
            print(line, file=sys.stderr, flush=True)


def _collect(run: Run, update: int) -> tuple[Rollout, dict[str, float]]:
    """This rank's block of the next G training tasks, N rollouts each, and the peak memory
    of the collection; the task cursor moves on by G. With ``train.async_lag`` >= 1 the
    batch comes from the producer (:mod:`mcgpo.training.pipeline`)."""
    if run.rollouts is not None:
        return run.rollouts.take(update)
    rollout, stats = collect_batch(run, run.model, update, run.task_cursor)
    run.task_cursor += run.cfg.rollout.groups
    return rollout, stats


def _warn(run: Run, text: str) -> None:
    """One warning line on the console (rank 0), above the progress bar."""
    if run.world.main:
        tqdm.write(f"mcgpo train: warning: {text}", file=sys.stderr)


def _first_error(rollout: Rollout) -> str:
    """The environment error of the rollout's first errored trajectory, cut to a line."""
    if not rollout.errors:
        return "unknown"
    text = " ".join(rollout.errors[min(rollout.errors)].split())
    return text if len(text) <= 300 else text[:300] + "..."


def _learned_nothing(run: Run, update: int, rollout: Rollout, metrics: dict[str, float]) -> bool:
    """True when every trajectory of the update (all ranks) hit an environment error; then
    a warning line names the first error."""
    total = metrics.get("rollout/trajectories", 0.0)
    if not total or metrics.get("rollout/errored_trajectories", 0.0) < total:
        return False
    _warn(
        run,
        f"update {update}: all {total:.0f} trajectories hit an environment error, nothing "
        f"was learned; first: {_first_error(rollout)}",
    )
    return True


def _stop_message(failed: int, update: int, saved_at: int, rollout: Rollout) -> str:
    where = (
        f"the last checkpoint is update {saved_at}: rerun with --resume once the environment "
        "is back"
        if saved_at
        else "no checkpoint yet: start the run again once the environment is back"
    )
    return (
        f"updates {update - failed + 1}-{update}: every trajectory hit an environment error "
        f"({failed} updates in a row, train.max_failed_updates); first: "
        f"{_first_error(rollout)}; {where}"
    )


def _update_metrics(
    rollout: Rollout, credit: Credit, stats: dict[str, float], times: dict[str, float]
) -> dict[str, float]:
    """One update's record: rollout stats, credit stats, update stats, advantages, times."""
    learned = len(credit.advantages) > 0
    return {
        **{f"rollout/{k}": v for k, v in rollout.stats.items()},
        **credit.stats,
        **stats,
        "adv/mean": float(credit.advantages.mean()) if learned else 0.0,
        "adv/std": float(credit.advantages.std()) if learned else 0.0,
        **times,
    }


def _evaluate(run: Run) -> dict[str, float]:
    """Evaluate the current policy, log it under the current update; returns the metrics."""
    if run.cfg.eval.tasks == 0:
        return {}
    clock = time.perf_counter()
    # a policy sharded in place cannot generate: the engine, which holds its weights, plays
    engine = run.engine if evaluates_on_engine(run) else None
    # train.async_lag >= 1: the producer samples with the engine; borrowed, serving θ_u
    lent = engine is not None and run.rollouts is not None
    show = run.cfg.progress and run.world.main
    with run.rollouts.lend_engine() if lent else contextlib.nullcontext(engine) as engine:
        stats = evaluate(run, run.world, engine=engine, show=show, pools=run.env_pools)
    if stats.get("eval/errored"):
        _warn(
            run,
            f"evaluation at update {run.updates_done}: {stats['eval/errored']:.0f} of "
            f"{stats['eval/episodes']:.0f} episodes hit an environment error (left out of "
            "the rates)",
        )
    stats["time/eval"] = time.perf_counter() - clock
    run.sinks.write(run.updates_done, stats)
    return stats


def _checkpoint(run: Run) -> None:
    """Rank 0 writes the full state (DDP: every rank holds the same weights and optimiser
    state; FSDP2: every rank first joins the gather of the sharded optimiser state); the
    others wait, so no rank runs ahead of a checkpoint that is being written."""
    optimizer_state = full_optimizer_state(run.learner, run.optimizer)
    # train.async_lag >= 1: the batches sampled ahead (every rank's, gathered)
    files = run.rollouts.checkpoint_files() if run.rollouts is not None else None
    weights = full_model_state(run.model)  # sharded in place: gathered to rank 0
    if run.world.main:
        _write_checkpoint(run, optimizer_state, weights, files)
    barrier(run.world)


def _write_checkpoint(
    run: Run,
    optimizer_state: dict[str, Any],
    weights: dict[str, Any] | None,
    files: Any = None,
) -> None:
    save_checkpoint(
        run.folder,
        model=run.model,
        tokenizer=run.tokenizer,
        optimizer=run.optimizer,
        update=run.updates_done,
        task_cursor=run.task_cursor,
        optimizer_state=optimizer_state,
        model_state=weights,
        extra_files=files,
    )


def _save_final_model(run: Run, weights: dict[str, Any] | None) -> None:
    """The trained policy in ``<out>/model`` (a ``--model`` folder for eval or more training);
    ``weights``: a sharded policy's, gathered (:func:`full_model_state`). LoRA: a PEFT
    adapter folder, and with ``train.lora_merge`` the merged model in ``<out>/merged``."""
    from mcgpo.policy import save_policy

    save_policy(run.model, run.tokenizer, run.folder / "model", state_dict=weights)
    if run.cfg.train.lora_merge and weights is not None:  # sharded: merged from the folder
        import shutil

        from mcgpo.training.export import export_merged

        shutil.rmtree(run.folder / "merged", ignore_errors=True)  # an earlier end's
        export_merged(run.folder / "model", run.folder / "merged")
    elif run.cfg.train.lora_merge:
        from mcgpo.policy.lora import merged_model

        save_policy(merged_model(run.model), run.tokenizer, run.folder / "merged")


def _save_rollouts(run: Run, update: int, rollout: Rollout, credit: Credit) -> None:
    """``rollouts/update-NNNNNN.parquet``: the StepTable plus what learning made of each row.

    Extra columns: ``learnable`` (False for errored trajectories), ``advantage`` (NaN where
    not learnable), ``pair`` (index of the row's preference pair or -1), ``pair_role``
    ("plus", "minus" or ""), ``pair_partner`` (row of the other decision or -1),
    ``pair_weight`` (c), ``pair_level`` ("exact"/"coarse") and ``response`` (decoded text).
    Row numbers are positions in this file. With W > 1 processes each rank writes its own
    groups to ``update-NNNNNN-rankR.parquet`` (groups numbered from 0 on each rank; rank r's
    groups follow those of ranks < r, see :func:`mcgpo.training.distributed.union_tables`).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = len(rollout.table)
    keep = np.flatnonzero(~rollout.table.errored)  # the rows of rollout.learnable()
    advantage = np.full(n, np.nan, dtype=np.float32)
    advantage[keep] = credit.advantages
    pair = np.full(n, -1, dtype=np.int64)
    partner = np.full(n, -1, dtype=np.int64)
    role = np.full(n, "", dtype=object)
    weight = np.zeros(n)
    level = np.full(n, "", dtype=object)
    plus, minus = keep[credit.plus], keep[credit.minus]
    for k, (a, b) in enumerate(zip(plus, minus)):
        pair[[a, b]] = k
        partner[a], partner[b] = b, a
        role[a], role[b] = "plus", "minus"
        weight[[a, b]] = credit.weight[k]
        level[[a, b]] = credit.level[k]
    responses = list(rollout.responses) or [""] * n
    table = rollout.table.to_arrow()
    learnable = np.zeros(n, dtype=bool)
    learnable[keep] = True
    extra = {
        "learnable": learnable,
        "advantage": advantage,
        "pair": pair,
        "pair_role": role.tolist(),
        "pair_partner": partner,
        "pair_weight": weight,
        "pair_level": level.tolist(),
        "response": responses,
    }
    for name, values in extra.items():
        table = table.append_column(name, pa.array(values))
    folder = run.folder / "rollouts"
    folder.mkdir(exist_ok=True)
    rank = f"-rank{run.world.rank}" if run.world.size > 1 else ""  # groups numbered per rank
    pq.write_table(table, folder / f"update-{update:06d}{rank}.parquet")


def _summary(run: Run) -> Table:
    """Evaluation before training (update 0) and after the last update, side by side."""
    records = [r for r in read_metrics(run.folder / "metrics.jsonl") if "eval/episodes" in r]
    columns: dict[str, dict[str, float]] = {}
    if records:
        first, last = records[0], records[-1]
        columns[f"before (update {first['update']})"] = _eval_only(first)
        if last is not first:
            columns[f"after (update {last['update']})"] = _eval_only(last)
    title = (
        f"{run.cfg.algo.name} on {run.cfg.env.name}: {run.updates_done} updates, "
        f"eval on {run.cfg.eval.tasks} held-out tasks at T={run.cfg.eval.temperature}; "
        f"run folder {run.folder}"
    )
    return Table.from_metrics(title, columns)


def _no_signal_note(run: Run) -> str | None:
    """A warning when no update of the run (resumed parts included) had a learning signal:
    every advantage zero and no preference pair, i.e. every sibling of every group had the
    same outcome, so only the KL and entropy terms moved the weights."""
    updates = [r for r in read_metrics(run.folder / "metrics.jsonl") if "adv/std" in r]
    if not updates or any(r["adv/std"] > 0 or r.get("pairs/preferences", 0) > 0 for r in updates):
        return None
    return (
        f"[train] warning: none of the {len(updates)} updates had a learning signal (every "
        "advantage zero, no preference pair: all siblings of each group had the same "
        "outcome), so the policy learned nothing from its tasks; a fresh policy rarely "
        "succeeds: warm-start it with `mcgpo sft` and train from its model "
        "(docs/training.md), or use more updates and tasks"
    )


def _eval_only(record: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in record.items() if k.startswith("eval/")}
