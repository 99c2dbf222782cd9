"""Group rollouts: G tasks x N sibling environments, all live environments sampled together.

This module plays a collection (:func:`collect`); one turn's decode, step and recording are
:mod:`mcgpo.rollout.turns`, the settings :mod:`mcgpo.rollout.collect_options`.

Settings (group size, split, sampling, prompt budget) come in one :class:`CollectOptions`.
Each task seed in ``tasks`` is played by ``group_size`` sibling environments reset with the
same seed (the same task). Environment ``e = g * N + slot`` plays task ``tasks[g]``; its
rows get ``group = g`` (the position in ``tasks``; a seed listed twice gives two groups),
``slot`` and ``traj = e``. Every turn, the prompts of all live environments go through one
:func:`~mcgpo.rollout.sampler.sample` call; the parsed actions go through one
``EnvPool.step``. With ``overlap_env`` the environments play in ``overlap_pieces`` fixed
pieces (contiguous blocks, :func:`env_pieces`): a piece's environments step (in a thread)
while other pieces decode, and the decoder takes the pieces in the order their steps
finish. A piece's turn is one sampler call holding exactly that piece's live rows, so the
company a row is decoded in never depends on the timing (the log-probs are the same, bit
for bit, run after run); each environment still sees the same prompts and draws from its
own generator, so the rollout is the sequential one, token for token, but for rare near
ties where the other company's float rounding moves a draw (tested); with
``batch_invariant`` every row is decoded in a sampler call of its own, and then no row's
tokens or log-probs depend on its company at all (bit for bit). What it
saves depends on how decoding and stepping cost scale with the number of rows
(docs/async.md works it out; ``benchmarks/bench_async.py`` measures).

Sampling: every environment draws its tokens from its own generator, seeded from
``(seed, group_offset + g, slot)`` (:func:`sampling_generators`), and the sampler draws each
row from its own generator. So a group's rollout depends on the seed, its global group index
and the policy only, not on the other groups of the call: a rank that plays global groups
``k .. k + G/W - 1`` (``group_offset = k``) samples exactly what one process playing all G
groups samples for them. ``group_offset`` changes nothing else (rows keep ``group = g``).

One StepTable row per agent turn, with the context of the observation *before* the action
(``anchor``, ``state``, ``state_coarse``, ``progress``, ``enabled``, ``progress_value``),
``next_anchor`` / ``next_progress_value`` from the observation after it, the step reward and
``done``, and the trajectory's outcome on every row: ``success`` = ``info["won"]`` and
``score`` = ``info["score"]`` of its last step. ``action_valid`` is the *format* check of the
parser (reference §1.2), not admissibility; the environment's own ``info["action_valid"]``
is summarised in the stats (``inadmissible_rate``).

A trajectory stops when the environment says ``done``, after ``max_turns`` turns (default:
the environment's ``max_turns``; the last row then has ``done = False``), or when its
environment errors. An errored trajectory keeps the rows of the turns that completed, marked
``errored`` (``Rollout.learnable()`` drops them); the turn that failed has no outcome and is
dropped, and a failure at reset leaves no rows.

Environments step in this process by default; ``workers > 0`` steps them in that many worker
processes (``EnvPool.in_workers``: ``env_factory`` must then be picklable, e.g.
:class:`~mcgpo.envs.workers.EnvSpec`), where a step past ``step_timeout`` seconds or one that
kills its worker also costs just its trajectory. Both give the same rollout for the same seeds.
A caller that plays many rollouts can build the pool once (:func:`open_pool`) and hand it to
every ``collect`` (``pool=``): each rollout resets every slot, so a kept pool gives the
rollouts of fresh ones (tested), without starting the worker processes again.

Prompt budget: a prompt longer than ``max_prompt_tokens`` is re-rendered without history
(verl-agent's WebShop rule, made general); if still too long its oldest tokens are cut
(``prompts_cut`` in the stats).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from mcgpo.envs.pool import EnvPool
from mcgpo.envs.protocol import Env, Observation
from mcgpo.rollout.collect_options import DEFAULT_MAX_NEW_TOKENS, CollectOptions
from mcgpo.rollout.overlap import env_pieces, play_overlapped
from mcgpo.rollout.prompts import default_response_format, stop_strings
from mcgpo.rollout.records import Rollout, Tally, Trajectory, assemble
from mcgpo.rollout.turns import RolloutTurns, Sampling

__all__ = [
    "DEFAULT_MAX_NEW_TOKENS",
    "CollectOptions",
    "Rollout",
    "collect",
    "env_pieces",
    "eos_ids",
    "open_pool",
    "sampling_generators",
]


def collect(
    model: Any,
    tokenizer: Any,
    env_factory: Callable[[], Env],
    tasks: Sequence[int],
    options: CollectOptions,
    *,
    engine: Any = None,
    on_turn: Callable[[int, int], None] | None = None,
    pool: EnvPool | None = None,
) -> Rollout:
    """Play every task with ``options.group_size`` siblings; return the rows, tokens, stats.

    Args:
        model, tokenizer: the policy (any Hugging Face causal LM and its tokenizer).
        env_factory: builds one fresh environment; called ``len(tasks) * group_size`` times
            (in the worker processes when ``options.workers > 0``: then it must be picklable).
        tasks: G task seeds; ``env.reset(seed=task, split=options.split)`` gives the task.
        options: group size, split, sampling and prompt settings (:class:`CollectOptions`).
        engine: a rollout engine whose ``sample`` method takes the sampler's arguments less
            the model (:class:`~mcgpo.rollout.vllm_engine.VLLMEngine`); it samples instead
            of ``options.sampler``, with the same prompts, budget, stops and generators.
        on_turn: called before each turn and at the end with (episodes finished, episodes
            in all): the caller's progress display (nothing here prints).
        pool: the environments to play in, ``len(tasks) * group_size`` of them, kept by the
            caller across rollouts (:func:`open_pool`; every slot is reset here, the pool is
            not closed); None: a pool is built from ``env_factory`` and closed at the end.
    """
    if len(tasks) == 0:
        raise ValueError("tasks is empty: give at least one task seed")
    start = time.perf_counter()
    n_env = len(tasks) * options.group_size
    sampling = _sampling(model, tokenizer, options, n_env, engine)
    seeds = [int(tasks[e // options.group_size]) for e in range(n_env)]
    tally = Tally()
    if engine is not None and options.batch_invariant:
        raise ValueError(
            "batch_invariant: a rollout engine batches and caches prompt prefixes as it "
            "schedules them, so a row's arithmetic depends on its company there"
        )
    if pool is not None and len(pool) != n_env:
        raise ValueError(f"pool has {len(pool)} environments, the rollout needs {n_env}")
    kept = pool is not None
    with contextlib.nullcontext(pool) if kept else open_pool(env_factory, n_env, options) as pool:
        limits = [options.max_turns or turns for turns in pool.max_turns]
        t_env = time.perf_counter()
        first = pool.reset(seeds, options.split)
        tally.env_seconds = time.perf_counter() - t_env
        chain = [tally.env_seconds] * n_env  # each row's chain of calls (below)
        current: list[Observation | None] = list(first)
        task_type = ["" if o is None else o.task_type for o in first]
        trajs = [Trajectory() for _ in range(n_env)]
        turns = RolloutTurns(
            sampling, pool, limits, current, trajs, task_type, tally, chain, on_turn
        )
        if options.overlap_env and n_env > 1:
            play_overlapped(turns, env_pieces(n_env, options.overlap_pieces))
        else:
            while live := turns.live(range(n_env), report=True):
                decoded = turns.decode(live)
                turns.record(decoded, turns.step(decoded))
        turns.live(range(n_env), report=True)  # the end: every episode finished
    errored = [bool(pool.errored[e]) for e in range(n_env)]
    rollout = assemble(trajs, errored, sampling.pad, tally, start)
    # the longest chain of calls one environment waited on (reset, its decodes, its steps):
    # no schedule of these calls ends sooner (docs/async.md, "Measured")
    rollout.stats["chain_seconds"] = max(chain)
    return replace(rollout, errors={int(e): str(m) for e, m in pool.errors.items()})


def open_pool(env_factory: Callable[[], Env], n_env: int, opts: CollectOptions) -> EnvPool:
    """``n_env`` environments for :func:`collect`: here, or in ``opts.workers`` processes
    (``opts.step_timeout`` per step); the caller closes it."""
    if opts.workers == 0:
        return EnvPool([env_factory() for _ in range(n_env)])
    return EnvPool.in_workers(
        env_factory, n_env, workers=opts.workers, step_timeout=opts.step_timeout
    )


def _sampling(
    model: Any, tokenizer: Any, opts: CollectOptions, n_env: int, engine: Any = None
) -> Sampling:
    """Resolve the response format and token budget; seed the generators on the model's device."""
    fmt = opts.response_format or default_response_format(tokenizer)
    budget = DEFAULT_MAX_NEW_TOKENS[fmt] if opts.max_new_tokens is None else opts.max_new_tokens
    device = next(model.parameters()).device
    eos = eos_ids(model, tokenizer)
    return Sampling(
        model=model,
        tokenizer=tokenizer,
        options=opts,
        fmt=fmt,
        budget=budget,
        stops=stop_strings(fmt),
        eos=eos,
        pad=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos),
        generators=sampling_generators(opts, n_env // opts.group_size, device),
        engine=engine,
    )


def sampling_generators(
    opts: CollectOptions, groups: int, device: torch.device | str = "cpu"
) -> list[torch.Generator]:
    """One generator per environment ``e = g * N + slot``, seeded from
    ``SeedSequence([opts.seed, opts.group_offset + g, slot])`` (64 bits): a trajectory's
    random stream depends on the seed and on its *global* group and slot, not on which
    other groups this call (this rank) plays (docs/rollout.md, item 27)."""
    out = []
    for g in range(groups):
        for slot in range(opts.group_size):
            entropy = [opts.seed, opts.group_offset + g, slot]
            state = np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0]
            out.append(torch.Generator(device=device).manual_seed(int(state)))
    return out


def eos_ids(model: Any, tokenizer: Any) -> list[int]:
    """EOS ids of the tokenizer and of the model's generation config (instruct models have two)."""
    ids: set[int] = set()
    for value in (
        tokenizer.eos_token_id,
        getattr(getattr(model, "generation_config", None), "eos_token_id", None),
    ):
        if isinstance(value, int):
            ids.add(value)
        elif value is not None:
            ids.update(int(v) for v in value)
    if not ids:
        raise ValueError("neither the tokenizer nor the model defines an eos_token_id")
    return sorted(ids)
