"""The turns of one group rollout: decode the live environments' prompts, step their
environments, record the rows (:class:`RolloutTurns`); :func:`~mcgpo.rollout.group_rollout.
collect` plays them one after another, or overlapped (:func:`~mcgpo.rollout.overlap.
play_overlapped`), with what every turn samples with (:class:`Sampling`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from mcgpo.envs.protocol import Observation
from mcgpo.rollout.collect_options import CollectOptions
from mcgpo.rollout.parsing import parse_action
from mcgpo.rollout.prompts import prompts_ids
from mcgpo.rollout.records import Tally, Trajectory, record_turn
from mcgpo.rollout.sampler import Samples
from mcgpo.rollout.static_decode import SAMPLERS

__all__ = ["Decoded", "RolloutTurns", "Sampling"]


@dataclass(frozen=True)
class Sampling:
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


@dataclass
class Decoded:
    """One sampler call's output for the live environments ``live`` of one turn."""

    live: list[int]
    prompts: list[list[int]]
    out: Any  # the sampler's result (response_ids, log_probs)
    texts: list[str]
    parsed: list[tuple[str, bool]]  # (action, well-formed) per row


@dataclass
class RolloutTurns:
    """The turns of one collection: decode the live environments' prompts, step their
    environments, record the rows. Sequentially (decode all, step all), or overlapped
    (:func:`~mcgpo.rollout.overlap.play_overlapped`). Each environment's turn reads only its own observation,
    history and generator, so both orders give the same tokens and episodes."""

    s: Sampling
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

    def decode(self, live: list[int]) -> Decoded:
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
        return Decoded(live, prompts, out, texts, [parse_action(t, s.fmt) for t in texts])

    def step(self, d: Decoded) -> dict[int, Any]:
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

    def record(self, d: Decoded, results: dict[int, Any]) -> None:
        """The rows of ``d``'s turn; an environment that errored on the step has none."""
        s, ids_of = self.s, d.out.response_ids
        truncated = sum(
            len(ids) == s.budget and ids[-1] not in s.eos and not any(x in t for x in s.stops)
            for ids, t in zip(ids_of, d.texts, strict=True)
        )
        with self.counting:  # pieces may record at once (play_overlapped)
            self.tally.generated += sum(len(ids) for ids in ids_of)
            self.tally.truncated += truncated
        for j, e in enumerate(d.live):
            ids = ids_of[j]
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


def _count_fit(tally: Tally, fit: str, had_history: bool) -> None:
    """Count a prompt's budget fallback (:func:`~mcgpo.rollout.prompts.prompt_ids`'s fit):
    re-rendered without history (also when then cut), or cut."""
    if fit == "no_history" or (fit == "cut" and had_history):
        tally.no_history += 1
    if fit == "cut":
        tally.cut += 1
