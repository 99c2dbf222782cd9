"""Rollouts that overlap the update, with a fixed lag (``train.async_lag k``).

Versions. ``θ_u`` is the policy after update ``u`` (``θ_0`` the initial one). Batch ``v`` (the
rollouts update ``v`` learns from) is sampled entirely with ``θ_s(v)``,

    s(v) = max(0, v - 1 - k)                                    (:func:`batch_version`)

whatever the timing, so update ``u`` learns from a batch ``min(k, u - 1)`` updates old (metric
``async/lag``). k = 0 is the sequential trainer (batch v sampled with θ_{v-1}; the loop then
runs no producer at all); k = 1 is "one step off": batch v + 1 is sampled with θ_{v-1} while
update v trains θ_{v-1} into θ_v on batch v. A batch is one :func:`~mcgpo.rollout.collect`
call on one frozen copy of the weights, so its groups never span two versions, and the
batch's seed and tasks are those of the sequential trainer for batch v
(``rollout_seed(seed, v)``, the task cursor's v-th block).

Schedule. ``θ_s(v)`` exists after update ``s(v)``; so batches ``1 .. k + 1`` (all from θ_0)
are asked for at the start, and batch ``u + 1 + k`` right after update ``u``, with a snapshot
of θ_u (a copy of the state dict, taken before update u + 1 changes the weights). One
producer thread samples the batches in order on a replica of the policy (its own copy; or
on the run's engine, below: the update waits only for the batch it learns from, the
producer only for the weights it samples with, ``time/wait_rollout`` and
``time/wait_update``); at most
k + 1 batches are asked for and not yet learned from, and at most k snapshots wait. Any k is
exact; each extra step of lag holds one more snapshot of the weights and one more batch.

Learning from an older batch: π_old is recomputed by the update's forward on θ_{u-1} (the
proximal policy of decoupled PPO) and the sampler's log-probs (behaviour policy, θ_s(v))
enter only the rollout correction (``train.rollout_correction``, auto = tis when k >= 1);
MCGPO's pair score d is against the recomputed π_old, never the behaviour policy.

Resume. A checkpoint after update u holds batches ``u + 1 .. u + k``
(:mod:`mcgpo.training.pending`; already sampled, or waited for); ``--resume`` puts them back
and asks only for batch u + 1 + k, with θ_u, the checkpoint's weights. So the run goes on as
if never stopped. After the last update no batch is asked for, but the ones asked for earlier
(up to U + k) are finished and kept in the final checkpoint, so that a resume with more
``train.updates`` continues exactly.

On the engine (``rollout.engine vllm``). The producer samples with the run's engine, no
replica: :meth:`RolloutPipeline.publish` takes the snapshot of θ_u that the engine takes
(:func:`mcgpo.rollout.engine_weights.weight_snapshot`; under FSDP2 sharded in place a gather,
in the learner's thread on every rank), and the producer loads it
(``VLLMEngine.update_weights_from``) before the first batch that needs it, unless the
engine serves that version already (:class:`ServedWeights`); a batch holds the engine from
its load to its last decode, so no generate call spans a weight swap. The loop does not
sync the engine after an update then. The engine cannot sleep through the update
(``rollout.vllm_sleep`` is refused with k >= 1): it samples the next batch meanwhile.

Evaluation runs on θ_u in the learner's thread, beside the producer: the environments of
both are open at once (a served environment needs sessions for G·N rollouts plus the
evaluation's). Where it samples on the engine (a policy sharded in place), the learner
borrows the engine between two batches (:meth:`RolloutPipeline.lend_engine`), loads θ_u
and evaluates; the producer loads its own version again before its next batch. A producer
failure ends the run with one line (:class:`RolloutProducerError`) at the learner's next
wait, never a hang; the run stops the producer before it closes the engine.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mcgpo.policy.precision import compute
from mcgpo.rollout.decode_step import decode_compile_stats
from mcgpo.rollout.group_rollout import Rollout, collect
from mcgpo.training.build import collect_options, rollout_seed
from mcgpo.training.distributed import gather_objects, rank_block
from mcgpo.training.metrics import PeakMemory
from mcgpo.training.pending import Batch, write_pending

__all__ = [
    "RolloutPipeline",
    "RolloutProducerError",
    "batch_version",
    "collect_batch",
    "evaluates_on_engine",
    "start_pipeline",
]

# How often a waiting learner looks whether the producer thread is still alive (seconds).
_POLL = 1.0


class RolloutProducerError(RuntimeError):
    """The rollout producer failed; the message is one line naming the batch and the error."""


def batch_version(number: int, lag: int) -> int:
    """s(v) = max(0, v - 1 - k): updates done on the weights that sample batch ``number``."""
    return max(0, number - 1 - lag)


def collect_batch(
    run: Any, model: Any, number: int, task_cursor: int, tokenizer: Any = None
) -> tuple[Rollout, dict]:
    """This rank's block of the G training tasks from ``task_cursor`` on, N rollouts each,
    sampled by ``model`` with the seed of batch ``number``; with the collection's peak memory
    and its seconds of environment steps and of decoding (``time/env``, ``time/decode``),
    and (compiled static sampler) its ``rollout/compile_*`` graph counts.
    ``tokenizer``: the run's, unless given (the producer's own copy). The environments are
    the run's kept training pool (``run.env_pools``, :mod:`mcgpo.training.env_pools`)."""
    cfg, world = run.cfg, run.world
    block = rank_block(cfg.rollout.groups, world)
    tasks = [task_cursor + g for g in block]
    options = collect_options(
        cfg,
        run.response_format,
        split=cfg.env.train_split,
        temperature=cfg.rollout.temperature,
        group_size=cfg.rollout.group_size,
        seed=rollout_seed(cfg.seed, number),
    )
    # the sampling streams follow the global group index: rank-independent rollouts
    options = dataclasses.replace(options, group_offset=block.start)
    memory = PeakMemory.start(cfg.device, "rollout")
    with compute(cfg.train.precision, cfg.device):  # the sampler in the update's precision
        tokenizer = run.tokenizer if tokenizer is None else tokenizer
        n_env = len(tasks) * options.group_size
        with run.env_pools.lease("train", run.make_env, n_env, options) as pool:
            rollout = collect(
                model, tokenizer, run.make_env, tasks, options, engine=run.engine, pool=pool
            )
    stats = memory.stop()
    stats["time/env"] = rollout.stats.get("env_seconds", 0.0)
    stats["time/decode"] = rollout.stats.get("sample_seconds", 0.0)
    return rollout, stats | decode_compile_stats()  # compiled static sampler: its graphs


def evaluates_on_engine(run: Any) -> bool:
    """Whether the run's evaluation samples on its rollout engine: where the policy is
    sharded in place (FSDP2 without a replica), which cannot generate; otherwise mcgpo's
    sampler plays the policy itself in the learner's thread."""
    from mcgpo.policy.loading import holds_shards

    return run.engine is not None and holds_shards(run.model)


def start_pipeline(run: Any) -> RolloutPipeline | None:
    """The producer of a run with ``train.async_lag`` >= 1 (None at 0: the loop collects
    itself), holding the batches ``run.pending`` restored from the checkpoint."""
    if run.cfg.train.async_lag == 0:
        return None
    return RolloutPipeline(run, run.pending)


class RolloutPipeline:
    """One producer thread that samples whole batches ahead of the update (module docstring).

    The learner calls :meth:`take` for batch u before update u, :meth:`publish` after it,
    :meth:`checkpoint_files` when it saves (every rank) and :meth:`close` at the end.
    """

    def __init__(self, run: Any, pending: list[Batch]) -> None:
        self.lag: int = run.cfg.train.async_lag
        self._run = run
        # rollout.engine vllm: the run's engine samples (ServedWeights: which θ it serves)
        self._engine = None if run.engine is None else ServedWeights(run)
        # a plain copy: freezing its parameters would change the kernels some layers pick
        # (the sampler's log-probs then differ from the sequential run's in the last bit)
        self._replica = copy.deepcopy(run.model) if run.engine is None else None
        self._stop = threading.Event()
        # a fast tokenizer used from two threads at once can fail ("Already borrowed")
        self._tokenizer = copy.deepcopy(run.tokenizer)
        self._requests: queue.Queue[tuple[int, dict | None, int] | None] = queue.Queue()
        self._done = {b.number: b for b in pending}
        self._changed = threading.Condition()
        self._error = ""
        self._cause: BaseException | None = None
        first = run.updates_done + 1
        for batch in pending:
            if not first <= batch.number <= first - 1 + self.lag:
                raise ValueError(f"pending batch {batch.number} does not follow update {first - 1}")
        for number in range(first, first + self.lag + 1):
            if number not in self._done and run.updates_done < run.cfg.train.updates:
                # from the weights the run holds now (none once the last update is done)
                if batch_version(number, self.lag) != run.updates_done:
                    raise ValueError(
                        f"batch {number} needs θ_{batch_version(number, self.lag)}, "
                        f"the run holds θ_{run.updates_done}: pending batches are missing"
                    )
                self._ask(number, None)
        # OpenMP's thread count is per thread: the producer takes the run's, not the default
        threads = torch.get_num_threads()
        self._thread = threading.Thread(
            target=self._produce, args=(threads,), name="rollout-producer", daemon=True
        )
        self._thread.start()

    # --- the learner's side ---------------------------------------------------------------

    def take(self, number: int) -> tuple[Rollout, dict[str, float]]:
        """Batch ``number`` (waits for it; ``time/wait_rollout``), its lag (``async/lag``);
        the run's task cursor moves on by G."""
        clock = time.perf_counter()
        batch = self._wait_for(number, pop=True)
        waited = time.perf_counter() - clock
        if batch.version != batch_version(number, self.lag):  # never: the schedule fixes it
            raise RolloutProducerError(f"batch {number} was sampled with θ_{batch.version}")
        self._run.task_cursor += self._run.cfg.rollout.groups
        lag = number - 1 - batch.version
        return batch.rollout, {**batch.stats, "async/lag": lag, "time/wait_rollout": waited}

    def publish(self) -> None:
        """After update u: ask for batch u + 1 + k, sampled with a snapshot of θ_u (none
        after the last update: θ_U is the final model and its checkpoint's)."""
        run = self._run
        if run.updates_done >= run.cfg.train.updates:
            return
        if self._engine is not None:  # the weights the engine takes (sharded: gathered)
            snapshot = self._engine.snapshot()
        else:
            snapshot = {k: t.detach().clone() for k, t in run.model.state_dict().items()}
        device = torch.device(run.cfg.device)
        if device.type == "cuda":  # the copies are done before the producer reads them
            torch.cuda.current_stream(device).synchronize()
        self._ask(run.updates_done + 1 + self.lag, snapshot)

    def checkpoint_files(self) -> Callable[[Path], None]:
        """Waits for batches u + 1 .. u + k (asked for already) and gathers every rank's
        (a collective: every rank calls it); returns what writes them into a checkpoint
        folder (rank 0 calls it, :func:`mcgpo.training.checkpoint.save_checkpoint`)."""
        u = self._run.updates_done
        mine = [self._wait_for(v, pop=False) for v in range(u + 1, u + 1 + self.lag)]
        ranks = gather_objects(mine, self._run.world)
        return lambda folder: write_pending(folder, self.lag, ranks)

    def lend_engine(self) -> contextlib.AbstractContextManager[Any]:
        """The run's engine serving θ_u (u = ``run.updates_done``), for the learner's
        evaluation: taken between two of the producer's batches and held until the
        context ends; the producer loads the weights of its next batch again after it. A
        sharded policy's weights are gathered first: a collective, every rank calls it."""
        if self._engine is None:
            raise RuntimeError("the rollout producer samples from its own replica, not an engine")
        return self._engine.lent()

    def close(self) -> None:
        """Stop the producer after the batch it is sampling (a failed run does not wait for
        more than that), before the run closes its engine."""
        self._stop.set()
        self._requests.put(None)
        self._thread.join(timeout=600)

    # --- the producer's side --------------------------------------------------------------

    def _ask(self, number: int, snapshot: dict | None) -> None:
        run = self._run
        # the task cursor stands after batch run.updates_done's tasks (take moved it on)
        cursor = run.task_cursor + (number - run.updates_done - 1) * run.cfg.rollout.groups
        self._requests.put((number, snapshot, cursor))

    def _wait_for(self, number: int, *, pop: bool) -> Batch:
        with self._changed:
            while number not in self._done:
                if self._error:
                    raise RolloutProducerError(self._error) from self._cause
                if not self._thread.is_alive():
                    raise RolloutProducerError(
                        f"rollout producer stopped before batch {number} (no error reported)"
                    )
                self._changed.wait(timeout=_POLL)
            return self._done.pop(number) if pop else self._done[number]

    def _produce(self, threads: int) -> None:
        torch.set_num_threads(threads)
        device = torch.device(self._run.cfg.device)
        # on a GPU the replica's kernels go to a stream of their own, beside the update's
        # (an engine schedules its own)
        own = device.type == "cuda" and self._engine is None
        stream = torch.cuda.Stream(device) if own else None
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            self._serve_requests(stream)

    def _serve_requests(self, stream: Any) -> None:
        version = self._run.updates_done
        while True:
            clock = time.perf_counter()
            request = self._requests.get()
            waited = time.perf_counter() - clock
            if request is None or self._stop.is_set():
                return
            number, snapshot, cursor = request
            try:
                if snapshot is not None:
                    version = batch_version(number, self.lag)
                if self._engine is not None:  # loaded between batches, never during one
                    rollout, stats = self._engine.collect(
                        number, cursor, version, snapshot, self._tokenizer
                    )
                else:
                    if snapshot is not None:
                        self._replica.load_state_dict(snapshot)
                        if stream is not None:  # read before the snapshot's memory is freed
                            stream.synchronize()
                    rollout, stats = collect_batch(
                        self._run, self._replica, number, cursor, tokenizer=self._tokenizer
                    )
            except BaseException as err:  # reaches the learner at its next wait
                reason = str(err).strip().splitlines()
                with self._changed:
                    self._error = (
                        f"rollout producer failed on batch {number}: {type(err).__name__}"
                        + (f": {reason[0]}" if reason else "")
                    )
                    self._cause = err
                    self._changed.notify_all()
                return
            request = snapshot = None  # loaded: not held while waiting for the next request
            stats["time/wait_update"] = waited
            with self._changed:
                self._done[number] = Batch(number, version, rollout, stats)
                self._changed.notify_all()


class ServedWeights:
    """The run's rollout engine as the producer's sampler (``rollout.engine vllm``): which
    θ it serves, and a lock that a batch holds from its weight load to its last decode.

    The producer loads the snapshot of θ_s(v) (:meth:`RolloutPipeline.publish`, taken in
    the learner's thread after update s(v)) before batch v, unless the engine serves it
    already; a batch never spans a weight swap. The learner borrows the engine for its
    evaluation between two batches (:meth:`lent`), loading θ_u; the producer then loads
    its own version again before its next batch, so it keeps the snapshot it serves
    (only where the learner borrows: evaluation on a policy sharded in place).
    """

    def __init__(self, run: Any) -> None:
        self._run = run
        self.engine = run.engine
        self.serves = run.updates_done  # the engine starts from the run's weights
        self._lock = threading.Lock()
        self._lends = bool(run.cfg.eval.tasks) and evaluates_on_engine(run)
        self._published: tuple[int, dict] | None = None  # θ_u's snapshot, for lent()
        # where evaluation borrows the engine, the producer may have to load θ_0 (or the
        # resumed θ_u) again: a copy of it (a collective under FSDP2; the learner's thread)
        self._held = self.snapshot_now() if self._lends else None

    def snapshot_now(self) -> dict:
        from mcgpo.rollout.engine_weights import weight_snapshot

        return weight_snapshot(self._run.model)

    def snapshot(self) -> dict:
        """θ_u's snapshot (u = run.updates_done) for the producer; kept for evaluation's
        load after the same update where the learner borrows the engine."""
        weights = self.snapshot_now()
        if self._lends:
            self._published = (self._run.updates_done, weights)
        return weights

    def collect(
        self, number: int, cursor: int, version: int, snapshot: dict | None, tokenizer: Any
    ) -> tuple[Rollout, dict]:
        """Batch ``number`` sampled by the engine serving θ_version (``snapshot``: its
        weights, new with this batch; None: the version of the batch before)."""
        if snapshot is not None:
            self._held = snapshot
        with self._lock:
            synced = self._serve(version, self._held)
            rollout, stats = collect_batch(
                self._run, self._run.model, number, cursor, tokenizer=tokenizer
            )
        if not self._lends:  # nobody else loads the engine: it keeps serving version
            self._held = None
        stats["time/weight_sync"] = synced
        return rollout, stats

    @contextlib.contextmanager
    def lent(self) -> Any:
        u = self._run.updates_done
        published, self._published = self._published, None
        weights = published[1] if published and published[0] == u else self.snapshot_now()
        with self._lock:
            self._serve(u, weights)
            yield self.engine

    def _serve(self, version: int, weights: dict | None) -> float:
        if self.serves == version:
            return 0.0
        if weights is None:  # never: the producer holds what it last loaded
            raise RuntimeError(f"the engine serves θ_{self.serves}; θ_{version} is not held")
        seconds = self.engine.update_weights_from(weights)
        self.serves = version
        return seconds
