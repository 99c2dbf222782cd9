"""Group rollouts: G tasks x N sibling environments, all live environments sampled together.

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
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from mcgpo.envs.pool import DEFAULT_STEP_TIMEOUT, EnvPool
from mcgpo.envs.protocol import Env, Observation
from mcgpo.rollout.decode_attention import DECODE_ATTENTIONS
from mcgpo.rollout.overlap import env_pieces, play_overlapped
from mcgpo.rollout.parsing import parse_action
from mcgpo.rollout.prompts import default_response_format, prompts_ids, stop_strings
from mcgpo.rollout.records import Rollout, Tally, Trajectory, assemble, record_turn
from mcgpo.rollout.sampler import Samples
from mcgpo.rollout.static_decode import SAMPLERS

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

# Response budget per format: the recipe's 512 for reasoning responses (reference §1.4);
# an action line is a handful of tokens.
DEFAULT_MAX_NEW_TOKENS = {"think": 512, "action": 32}


@dataclass(frozen=True, kw_only=True)
class CollectOptions:
    """How :func:`collect` plays its tasks; checked when built (one-line ``ValueError``).

    The recipe's values (group size, split, temperature, history) have no defaults here:
    their defaults are the run configuration's, and the trainer and the evaluation build
    every field from it (:func:`mcgpo.training.build.collect_options`). The optional fields
    default to "derive it" (from the environment, the format, the tokenizer) or to no limit.
    """

    group_size: int  # N sibling rollouts per task
    split: str  # env.reset(seed=task, split=split) gives the task
    temperature: float  # sampling temperature (1.0 for training, 0.4 for evaluation)
    history: int  # observation/action pairs shown in the prompt (h)
    max_turns: int | None = None  # turn limit; None: each environment's max_turns
    max_new_tokens: int | None = None  # response budget; None: 512 for "think", 32 for "action"
    response_format: str | None = None  # "think" or "action"; None: by the tokenizer
    seed: int = 0  # seeds the sampling generators: same seed and weights, same rollout
    group_offset: int = 0  # global index of tasks[0]'s group (a rank's block); seeds only
    max_prompt_tokens: int | None = None  # prompt budget (module docstring); None: no limit
    workers: int = 0  # environment worker processes; 0: step in this process
    step_timeout: float = DEFAULT_STEP_TIMEOUT  # seconds per step in a worker (workers > 0)
    sampler: str = "dynamic"  # "dynamic" (sampler.sample) or "static" (static_decode)
    decode_attention: str = "gqa"  # the static sampler's single-token attention (or "sdpa")
    overlap_env: bool = False  # pieces of the rows: some step while others decode
    overlap_pieces: int = 2  # how many fixed pieces with overlap_env (>= 2)
    batch_invariant: bool = False  # one sampler call per row: no row's company matters

    def __post_init__(self) -> None:
        if self.group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {self.group_size}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.history < 0:
            raise ValueError(f"history must be >= 0, got {self.history}")
        for name in ("max_turns", "max_new_tokens", "max_prompt_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {value}")
        if self.response_format is not None:
            stop_strings(self.response_format)  # an unknown format is named
        p = self.overlap_pieces
        if isinstance(p, bool) or not isinstance(p, int) or p < 2:
            raise ValueError(f"overlap_pieces must be an integer >= 2, got {p!r}")
        if not isinstance(self.batch_invariant, bool):
            raise ValueError(f"batch_invariant must be true or false, got {self.batch_invariant!r}")
        for name in ("workers", "group_offset"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if not self.step_timeout > 0 or self.step_timeout == float("inf"):
            raise ValueError(f"step_timeout must be a finite number > 0, got {self.step_timeout}")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {sorted(SAMPLERS)}, got {self.sampler!r}")
        if self.decode_attention not in DECODE_ATTENTIONS:
            raise ValueError(
                f"decode_attention must be one of {list(DECODE_ATTENTIONS)}, "
                f"got {self.decode_attention!r}"
            )


@dataclass(frozen=True)
class _Sampling:
    """What every turn samples with: the policy, the response format and the generators."""

    model: Any
    tokenizer: Any
    options: CollectOptions
    fmt: str  # the response format, resolved
    budget: int  # max new tokens per response
    stops: tuple[str, ...]
    eos: list[int]
    pad: int
    generators: list[torch.Generator]  # [G * N] one per environment (sampling_generators)
    engine: Any = None  # samples instead of SAMPLERS[options.sampler] when given


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
        turns = _Turns(sampling, pool, limits, current, trajs, task_type, tally, chain, on_turn)
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
) -> _Sampling:
    """Resolve the response format and token budget; seed the generators on the model's device."""
    fmt = opts.response_format or default_response_format(tokenizer)
    budget = DEFAULT_MAX_NEW_TOKENS[fmt] if opts.max_new_tokens is None else opts.max_new_tokens
    device = next(model.parameters()).device
    eos = eos_ids(model, tokenizer)
    return _Sampling(
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


@dataclass
class _Decoded:
    """One sampler call's output for the live environments ``live`` of one turn."""

    live: list[int]
    prompts: list[list[int]]
    out: Any  # the sampler's result (response_ids, log_probs)
    texts: list[str]
    parsed: list[tuple[str, bool]]  # (action, well-formed) per row


@dataclass
class _Turns:
    """The turns of one collection: decode the live environments' prompts, step their
    environments, record the rows. Sequentially (decode all, step all), or overlapped
    (:func:`~mcgpo.rollout.overlap.play_overlapped`). Each environment's turn reads only its own observation,
    history and generator, so both orders give the same tokens and episodes."""

    s: _Sampling
    pool: Any
    limits: list[int]
    current: list[Observation | None]
    trajs: list[Trajectory]
    task_type: list[str]
    tally: Tally
    chain: list[float]  # per environment: seconds of the decode and step calls it was in
    on_turn: Callable[[int, int], None] | None = None  # (episodes finished, episodes)
    counting: threading.Lock = field(default_factory=threading.Lock)  # the tally's counts
    ready: dict[int, list[int]] = field(default_factory=dict)  # prompts built ahead (prepare)

    def live(self, envs: Iterable[int], report: bool = False) -> list[int]:
        """The environments of ``envs`` that play another turn; with ``report``, ``envs``
        being all of them, ``on_turn`` hears how many have finished."""
        trajs = self.trajs
        live = [
            e
            for e in envs
            if self.current[e] is not None
            and not trajs[e].done
            and not self.pool.errored[e]
            and len(trajs[e].rows) < self.limits[e]
        ]
        if report and self.on_turn is not None:
            self.on_turn(len(trajs) - len(live), len(trajs))
        return live

    def decode(self, live: list[int]) -> _Decoded:
        """One sampler call for the prompts of ``live``; the parsed actions."""
        s, opts = self.s, self.s.options
        if all(e in self.ready for e in live):
            prompts = [self.ready.pop(e) for e in live]
        else:
            prompts = self.prompts(live)
        t0 = time.perf_counter()
        draw = SAMPLERS[opts.sampler] if s.engine is None else _engine_sample(s.engine)
        static = s.engine is None and opts.sampler == "static"
        extra = {"decode_attention": opts.decode_attention} if static else {}

        def call(rows: list[int], texts: list[list[int]]) -> Any:
            return draw(
                s.model, texts, temperature=opts.temperature, max_new_tokens=s.budget,
                eos_token_id=s.eos, pad_token_id=s.pad, stop_strings=s.stops,
                tokenizer=s.tokenizer, generator=[s.generators[e] for e in rows], **extra,
            )  # fmt: skip

        if opts.batch_invariant:  # each row alone: the same arithmetic in any company
            alone = [call([e], [p]) for e, p in zip(live, prompts, strict=True)]
            out = Samples([o.response_ids[0] for o in alone], [o.log_probs[0] for o in alone])
        else:
            out = call(live, prompts)
        seconds = time.perf_counter() - t0
        self.tally.sample_seconds += seconds
        for e in live:
            self.chain[e] += seconds
        texts = s.tokenizer.batch_decode(out.response_ids, skip_special_tokens=True)
        return _Decoded(live, prompts, out, texts, [parse_action(t, s.fmt) for t in texts])

    def step(self, d: _Decoded) -> dict[int, Any]:
        """One ``EnvPool.step`` of ``d``'s actions (``time/env``)."""
        t0 = time.perf_counter()
        results = self.pool.step({e: d.parsed[j][0] for j, e in enumerate(d.live)})
        seconds = time.perf_counter() - t0
        with self.counting:  # pieces may step at once (play_overlapped)
            self.tally.env_seconds += seconds
            for e in d.live:
                self.chain[e] += seconds
        return results

    def prompts(self, live: list[int]) -> list[list[int]]:
        """The prompt ids of ``live``'s next turn, tokenized in one call (counting the budget
        fallbacks)."""
        s, opts = self.s, self.s.options
        decisions = []
        for e in live:
            obs = self.current[e]
            assert obs is not None
            decisions.append((obs, self.trajs[e].past))
        built = prompts_ids(
            s.tokenizer, decisions, history=opts.history, response_format=s.fmt,
            max_prompt_tokens=opts.max_prompt_tokens,
        )  # fmt: skip
        with self.counting:
            for e, (_, fit) in zip(live, built, strict=True):
                _count_fit(self.tally, fit, opts.history > 0 and bool(self.trajs[e].past))
        return [ids for ids, _ in built]

    def prepare(self, envs: Iterable[int]) -> None:
        """Build the next prompts of ``envs``' live environments now (play_overlapped: in the
        thread that stepped them, beside other pieces' decoding: a fast tokenizer encodes a
        batch without holding the GIL); their next ``decode`` takes them."""
        live = self.live(envs)
        self.ready.update(zip(live, self.prompts(live), strict=True))

    def record(self, d: _Decoded, results: dict[int, Any]) -> None:
        """The rows of ``d``'s turn; an environment that errored on the step has none."""
        s, tally = self.s, self.tally
        for j, e in enumerate(d.live):
            ids = d.out.response_ids[j]
            truncated = (
                len(ids) == s.budget
                and ids[-1] not in s.eos
                and not any(x in d.texts[j] for x in s.stops)
            )
            with self.counting:  # pieces may record at once (play_overlapped)
                tally.generated += len(ids)
                tally.truncated += int(truncated)
            if e not in results:  # the environment errored on this step
                continue
            obs, res = self.current[e], results[e]
            assert obs is not None
            action, valid = d.parsed[j]
            tr = self.trajs[e]
            record_turn(tr, obs, res, action, valid, e, s.options.group_size, self.task_type[e])
            tr.prompts.append(d.prompts[j])
            tr.responses.append(ids)
            tr.log_probs.append(d.out.log_probs[j])
            tr.texts.append(d.texts[j])
            self.current[e] = res.observation


def _engine_sample(engine: Any) -> Callable[..., Any]:
    """The engine's ``sample`` with the sampler's signature (the model argument dropped)."""
    return lambda _model, prompts, **kwargs: engine.sample(prompts, **kwargs)


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


def _count_fit(tally: Tally, fit: str, had_history: bool) -> None:
    """Count a prompt's budget fallback (:func:`~mcgpo.rollout.prompts.prompt_ids`'s fit):
    re-rendered without history (also when then cut), or cut."""
    if fit == "no_history" or (fit == "cut" and had_history):
        tally.no_history += 1
    if fit == "cut":
        tally.cut += 1
