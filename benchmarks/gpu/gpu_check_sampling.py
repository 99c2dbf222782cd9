"""Parts a (sampling, with the decode attention switch) and c (pi_old under bf16) of the
device check (benchmarks/gpu/gpu_check.py); each runs in a process of its own."""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from gpu_check_context import Part, accepts, goal, household_prompts, num, throughput

ATTENTIONS = ("sdpa", "gqa")  # transformers' sdpa (K/V expanded), mcgpo's GQA-native decode


class PrefillClock:
    """Wraps a prefill function so that its time (device synchronised) is summed apart."""

    def __init__(self, sync: Callable[[], None]) -> None:
        self.seconds, self._sync = 0.0, sync

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._sync()
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._sync()
                self.seconds += time.perf_counter() - start

        return timed


@contextlib.contextmanager
def prefill_timed(clock: PrefillClock) -> Iterator[None]:
    """Time the prefill of the dynamic sampler (``sampler._prefill``) and of the static one
    (``static_decode._Run.prefill``) apart from their decode steps, inside this process."""
    from mcgpo.rollout import sampler, static_decode

    dynamic, static = sampler._prefill, static_decode._Run.prefill
    sampler._prefill = clock.wrap(dynamic)
    static_decode._Run.prefill = clock.wrap(static)
    try:
        yield
    finally:
        sampler._prefill, static_decode._Run.prefill = dynamic, static


def time_call(part: Part, fn: Callable[[], Any], clock: PrefillClock) -> tuple[float, float, Any]:
    """Best (whole call, its prefill) seconds over the part's repeats, and the last result."""
    best, out = (float("inf"), 0.0), None
    for _ in range(part.sizes.repeats):
        clock.seconds = 0.0
        part.sync()
        start = time.perf_counter()
        out = fn()
        part.sync()
        best = min(best, (time.perf_counter() - start, clock.seconds))
    return (*best, out)


def compare_samples(
    first: Sequence[Sequence[int]],
    second: Sequence[Sequence[int]],
    first_logp: Sequence[Sequence[float]],
    second_logp: Sequence[Sequence[float]],
) -> dict[str, float]:
    """How far two samplers' draws from the same prompts and seeds agree.

    ``tokens``: the share of positions (over the longer of each pair of rows) holding the same
    token; ``rows``: the share of rows identical; ``first``: the share of rows whose first
    token agrees; ``max_dlogp`` / ``mean_dlogp``: |delta log p| over each row's common prefix
    (the positions before its first differing token: the same token in the same context),
    0 when no row has one."""
    if len(first) != len(second):
        raise ValueError(f"{len(first)} rows against {len(second)}")
    same = total = whole = firsts = 0
    deltas: list[float] = []
    for a, b, la, lb in zip(first, second, first_logp, second_logp):
        total += max(len(a), len(b))
        agree = [x == y for x, y in zip(a, b)]
        same += sum(agree)
        whole += len(a) == len(b) and all(agree)
        firsts += bool(agree) and agree[0]
        prefix = agree.index(False) if False in agree else len(agree)
        deltas += [abs(x - y) for x, y in zip(la[:prefix], lb[:prefix])]
    rows = max(len(first), 1)
    return {
        "tokens": same / max(total, 1), "rows": whole / rows, "first": firsts / rows,
        "max_dlogp": max(deltas, default=0.0), "mean_dlogp": float(np.mean(deltas or [0.0])),
    }  # fmt: skip


def part_sampler(part: Part) -> None:
    """generate, the dynamic sampler, and the static sampler with each decode attention
    (``decode_attention`` sdpa and gqa); decode steps timed apart from prefill."""
    from mcgpo.rollout import sample
    from mcgpo.rollout.static_decode import _STEPS, sample_static

    s, model, tok = part.sizes, part.model(torch.bfloat16), part.tokenizer
    prompts = household_prompts(tok, s.rows)
    ids, mask = throughput._left_padded(prompts, tok.pad_token_id, part.device)
    common = {"temperature": 1.0, "max_new_tokens": s.new_tokens, "eos_token_id": [-1],
              "pad_token_id": tok.pad_token_id}  # fmt: skip
    tokens = len(prompts) * s.new_tokens
    mean_prompt = float(np.mean([len(p) for p in prompts]))
    bound = throughput.decode_bound(model, len(prompts), mean_prompt + s.new_tokens / 2,
                                    part.bandwidth)  # fmt: skip
    clock = PrefillClock(part.sync)

    def generate() -> None:
        with torch.inference_mode():
            model.generate(
                ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                min_new_tokens=s.new_tokens, max_new_tokens=s.new_tokens,
                pad_token_id=tok.pad_token_id,
            )  # fmt: skip

    def dynamic() -> None:
        sample(model, prompts, generator=torch.Generator(part.device).manual_seed(0), **common)

    where = f"{s.rows} rows, prompts {mean_prompt:.0f} tokens mean, {s.new_tokens} new"
    with prefill_timed(clock):
        generate()  # warm-up
        gen_s, _, _ = time_call(part, generate, clock)
        part.emit(("generate tok/s", num(tokens / gen_s), f"{where}; whole call, prefill included"))
        dynamic()
        dyn_s, dyn_pre, _ = time_call(part, dynamic, clock)
        part.emit(
            ("dynamic decode tok/s", num(tokens / (dyn_s - dyn_pre)), "KV cache, after prefill"),
            ("dynamic prefill s", f"{dyn_pre:.3f}", f"whole call {dyn_s:.3f} s"),
            ("bandwidth bound tok/s", num(bound),
             f"(weights + KV) read once per decode step at {part.bandwidth / 1e9:.0f} GB/s"),
        )  # fmt: skip
        switch = accepts(sample_static, "decode_attention")
        drawn: dict[str, Any] = {}
        speed: dict[str, float] = {}
        for attention in ATTENTIONS:
            measures = static_measures(attention)
            if attention == "gqa" and not switch:
                part.missing("decode_attention keyword in sample_static", *measures)
                continue
            extra = {"decode_attention": attention} if switch else {}
            what = ("transformers' sdpa (K/V expanded to the query heads)" if attention == "sdpa"
                    else "mcgpo's GQA-native decode attention")  # fmt: skip
            if not switch:
                what += " (no decode_attention switch here: the model's own attention)"
            st_s, st_pre, out, note = static_run(part, model, prompts, common, extra, clock)
            _STEPS.pop(model, None)  # the other attention compiles its own step
            drawn[attention], speed[attention] = out, tokens / (st_s - st_pre)
            pct = 100 * speed[attention] / bound
            part.emit(
                (measures[0], num(speed[attention]), f"{what}; {note}; after prefill"),
                (measures[1], f"{st_pre:.3f}", f"whole call {st_s:.3f} s"),
                (measures[2], f"{gen_s / st_s:.2f}",
                 "whole calls; " + goal(">= 3", gen_s / st_s >= 3, part.judged)),
                (measures[3], num(pct), "decode steps only (prefill timed apart); "
                 + goal(">= 30 (GPU: 128 rows x 128 new tokens)", pct >= 30, part.judged)),
            )  # fmt: skip
        if "gqa" in drawn:
            emit_comparison(part, drawn, speed)
        else:
            part.missing("decode_attention keyword in sample_static", *COMPARISON)


COMPARISON = ("gqa / sdpa decode tok/s", "gqa vs sdpa: tokens equal %",
              "gqa vs sdpa: first tokens equal %", "gqa vs sdpa: max abs dlogp, common prefix")  # fmt: skip


def static_measures(attention: str) -> tuple[str, str, str, str]:
    """The four rows of the static sampler with one decode attention."""
    return (f"static decode tok/s, {attention}", f"static prefill s, {attention}",
            f"static / generate, {attention}", f"static decode % of bound, {attention}")  # fmt: skip


def static_run(
    part: Part, model: Any, prompts: list[list[int]], common: dict[str, Any],
    extra: dict[str, Any], clock: PrefillClock,
) -> tuple[float, float, Any, str]:  # fmt: skip
    """The static sampler, compiled on CUDA (eager if compilation fails): best (whole call,
    prefill) seconds, the last call's samples (seed 0) and a note on how it ran."""
    from mcgpo.rollout.static_decode import _STEPS, sample_static

    compiled = part.device.type == "cuda"

    def static() -> Any:
        g = torch.Generator(part.device).manual_seed(0)
        return sample_static(model, prompts, generator=g, compile=compiled, **common, **extra)

    note = "static cache, compiled decode step" if compiled else "static cache, eager"
    part.sync()
    start = time.perf_counter()
    try:
        static()  # warm-up: compiles the decode step on CUDA
    except Exception as err:  # keep a number: the static sampler without compilation
        if not compiled:
            raise
        note = f"EAGER: compile failed ({type(err).__name__}: {str(err)[:120]})"
        compiled = False
        _STEPS.pop(model, None)
        static()
    part.sync()
    if compiled:
        note += f", first call (compile) {time.perf_counter() - start:.1f} s"
    return (*time_call(part, static, clock), note)


def emit_comparison(part: Part, drawn: dict[str, Any], speed: dict[str, float]) -> None:
    """The two attentions' draws compared (same prompts, same seed, all rows live)."""
    a, b = drawn["sdpa"], drawn["gqa"]
    same = compare_samples(a.response_ids, b.response_ids, a.log_probs, b.log_probs)
    part.emit(
        (COMPARISON[0], f"{speed['gqa'] / speed['sdpa']:.2f}", "decode steps, same prompts"),
        (COMPARISON[1], num(100 * same["tokens"]),
         f"positions with the same token (seed 0, one shared generator); rows identical "
         f"{100 * same['rows']:.0f} %; bf16 rounding can flip a draw, the row then diverges"),
        (COMPARISON[2], num(100 * same["first"]),
         "the first token comes from the prefill, which decode attention does not change: "
         + goal("100", same["first"] == 1.0, part.judged)),
        (COMPARISON[3], f"{same['max_dlogp']:.4f}",
         f"mean {same['mean_dlogp']:.5f}; the same tokens in the same context (each row "
         "before its first differing token)"),
    )  # fmt: skip


def _row_means(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum(1) / mask.sum(1).clamp(min=1)


def part_pi_old(part: Part) -> None:
    """Sampler log-probs (bf16, KV cache) against the training forward at theta = theta_old."""
    from mcgpo.policy import token_log_probs
    from mcgpo.rollout import TokenBatch, sample

    s, model, tok = part.sizes, part.model(torch.bfloat16), part.tokenizer
    prompts = household_prompts(tok, s.pi_rows)
    out = sample(
        model, prompts, temperature=1.0, max_new_tokens=s.pi_tokens, eos_token_id=[-1],
        pad_token_id=tok.pad_token_id, generator=torch.Generator(part.device).manual_seed(0),
    )  # fmt: skip
    batch = TokenBatch.from_sequences(prompts, out.response_ids, out.log_probs, pad_token_id=tok.pad_token_id).to(part.device)  # fmt: skip
    mask = batch.response_mask.float()

    def forward(m: Any, rows: int, autocast: bool = False) -> torch.Tensor:
        parts = []
        for k in range(0, len(batch), rows):
            mb = batch.select(np.arange(k, min(k + rows, len(batch))))
            ctx = torch.autocast(part.device.type, dtype=torch.bfloat16)
            with torch.no_grad(), ctx if autocast else contextlib.nullcontext():
                lp = token_log_probs(m, mb.input_ids, mb.attention_mask)
            parts.append(torch.nn.functional.pad(lp, (0, batch.input_ids.shape[1] - lp.shape[1])))
        return torch.cat(parts)

    train_bf16 = forward(model, s.micro)
    master = copy.deepcopy(model).float()
    train_mixed = forward(master, s.micro, autocast=True)
    del master
    recomputed = forward(model, len(batch))  # pi_old by the training forward, whole batch
    for name, train in (("bf16", train_bf16), ("fp32+autocast", train_mixed)):
        delta = (train - batch.old_log_probs).abs()[batch.response_mask]
        part.emit((f"max abs dlogp, sampler vs {name} fwd", f"{float(delta.max()):.4f}",
                   f"mean {float(delta.mean()):.5f}; {s.pi_rows} rows x {s.pi_tokens} tokens"))  # fmt: skip
    for name, old in (("sampler's", batch.old_log_probs), ("recomputed", recomputed)):
        d = _row_means(train_bf16 - old, mask)
        part.emit((f"d spread (SD), {name} pi_old", f"{float(d.std()):.2e}",
                   f"max abs d {float(d.abs().max()):.2e}; theta = theta_old, micro {s.micro}"))  # fmt: skip
