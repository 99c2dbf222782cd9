"""The static-cache sampler returns what the dynamic one returns; stop tables; per-row draws."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mcgpo.policy import token_log_probs
from mcgpo.rollout import TokenBatch, sample
from mcgpo.rollout.static_decode import SAMPLERS, sample_static
from mcgpo.rollout.stop_tables import _token_pieces, stop_tables


def prompts_of_lengths(tokenizer, lengths):
    text = "Your task is to: count to 4. The counter shows 2. step wait step " * 4
    ids = tokenizer(text)["input_ids"]
    return [ids[:n] for n in lengths]


def both(model, tok, prompts, seed=0, sync_every=8, **kw):
    """(dynamic, static) samples of the same call, each from a fresh generator ``seed``."""
    kw.setdefault("temperature", 1.0)
    kw.setdefault("max_new_tokens", 10)
    kw.setdefault("eos_token_id", tok.eos_token_id)
    kw.setdefault("pad_token_id", tok.pad_token_id)
    dyn = sample(model, prompts, generator=torch.Generator().manual_seed(seed), **kw)
    sta = sample_static(
        model, prompts, generator=torch.Generator().manual_seed(seed), sync_every=sync_every, **kw
    )
    return dyn, sta


def assert_same(dyn, sta):
    assert sta.response_ids == dyn.response_ids
    for a, b in zip(dyn.log_probs, sta.log_probs):
        assert b == pytest.approx(a, abs=1e-5)


def frequent_tokens(model, tok, prompts, k):
    """The k most frequent tokens of a free greedy run: EOS ids that end rows early."""
    free = sample(
        model, prompts, temperature=0.0, max_new_tokens=10, eos_token_id=[-1],
        pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    counts: dict[int, int] = {}
    for r in free.response_ids:
        for t in r[1:]:
            counts[t] = counts.get(t, 0) + 1
    return sorted(counts, key=lambda t: -counts[t])[:k]


@pytest.mark.parametrize(("prefill_rows", "sync_every"), [(8, 8), (2, 3), (1, 1)])
def test_greedy_equals_the_dynamic_sampler_with_early_ends(
    counter_policy, prefill_rows, sync_every
):
    model, tok = counter_policy
    # 7 rows (padded to 8 static rows), left padding 24 .. 0, duplicates share a prefill
    prompts = prompts_of_lengths(tok, [2, 6, 11, 19, 25, 6, 11])
    eos = frequent_tokens(model, tok, prompts, 2)
    dyn, sta = both(
        model, tok, prompts, temperature=0.0, eos_token_id=eos, prefill_rows=prefill_rows,
        sync_every=sync_every,
    )  # fmt: skip
    assert_same(dyn, sta)
    assert min(map(len, sta.response_ids)) < 10  # some rows did end early


def test_seeded_draws_equal_the_dynamic_sampler(counter_policy):
    model, tok = counter_policy
    prompts = prompts_of_lengths(tok, [3, 8, 8, 20, 14])
    # no row ends: the shared generator's draws agree for any sync interval
    assert_same(*both(model, tok, prompts, eos_token_id=[-1], sync_every=4, temperature=0.7))
    # rows end at different steps: with a host read every step the live rows are known, so
    # the draws equal the dynamic sampler's (which draws for live rows only)
    eos = list(range(3, 300, 7))  # 43 of 300 ids end a row
    dyn, sta = both(model, tok, prompts, eos_token_id=eos, sync_every=1, max_new_tokens=16)
    assert_same(dyn, sta)
    assert len(set(map(len, sta.response_ids))) > 1


def test_stop_strings_end_rows_on_the_device(counter_policy):
    model, tok = counter_policy
    prompts = prompts_of_lengths(tok, [4, 9, 15, 22])
    free = sample(
        model, prompts, temperature=0.0, max_new_tokens=12, eos_token_id=[-1],
        pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    pieces = [tok.decode([t]) for t in free.response_ids[2]]
    # a stop string spanning two tokens' pieces: its automaton state crosses a token
    k = next(i for i in range(1, len(pieces)) if pieces[i].strip() and pieces[i - 1].strip())
    stop = pieces[k - 1][-2:] + pieces[k][:2]
    kw = {"temperature": 0.0, "max_new_tokens": 12, "eos_token_id": [-1], "tokenizer": tok}
    dyn, sta = both(model, tok, prompts, stop_strings=[stop, "zzz"], sync_every=5, **kw)
    assert_same(dyn, sta)
    assert len(sta.response_ids[2]) <= k + 1
    # the tables decode every id in one batch_decode: the same pieces as decode([t])
    assert _token_pieces(tok, len(tok) + 2) == [tok.decode([t]) for t in range(len(tok))] + [""] * 2
    dyn, sta = both(model, tok, prompts, stop_strings=[""], **kw)  # in every text
    assert_same(dyn, sta)
    assert [len(r) for r in sta.response_ids] == [1, 1, 1, 1]


def test_log_probs_equal_a_fresh_forward_pass(counter_policy):
    model, tok = counter_policy
    prompts = prompts_of_lengths(tok, [30, 1, 9, 4, 17])
    out = sample_static(
        model, prompts, temperature=1.0, max_new_tokens=12, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, generator=torch.Generator().manual_seed(1),
    )  # fmt: skip
    batch = TokenBatch.from_sequences(
        prompts, out.response_ids, out.log_probs, pad_token_id=tok.pad_token_id
    )
    with torch.no_grad():
        fresh = token_log_probs(model, batch.input_ids, batch.attention_mask)
    mask = batch.response_mask
    assert torch.allclose(fresh[mask], batch.old_log_probs[mask], atol=1e-4, rtol=0)


def reference_row(model, prompt, generator, temperature, eos, max_new):
    """One row without a cache: full forward per step; the dynamic sampler's per-row rule
    (``max_new`` uniforms drawn at the start, inverse CDF per step)."""
    u = torch.rand(max_new, generator=generator)
    ids, lps = list(prompt), []
    for step in range(max_new):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
        cdf = torch.softmax(logits / temperature, -1).cumsum(-1)
        token = min(int(torch.searchsorted(cdf, u[step] * cdf[-1], right=True)), len(cdf) - 1)
        lps.append(float(torch.log_softmax(logits / temperature, -1)[token]))
        ids.append(token)
        if token in eos:
            break
    return ids[len(prompt) :], lps


def test_per_row_generators_draw_each_row_alone_and_end_where_it_ends(counter_policy):
    model, tok = counter_policy
    prompts = prompts_of_lengths(tok, [5, 5, 12, 21, 9])
    eos = set(range(3, 300, 9))

    def gens():
        return [torch.Generator().manual_seed(100 + i) for i in range(len(prompts))]

    kw = dict(temperature=1.0, max_new_tokens=14, eos_token_id=eos, pad_token_id=tok.pad_token_id)
    mine = gens()
    out = sample_static(model, prompts, generator=mine, sync_every=4, **kw)
    assert len(set(map(len, out.response_ids))) > 1  # rows ended inside sync blocks
    dynamic_gens = gens()
    dyn = sample(model, prompts, generator=dynamic_gens, **kw)
    assert_same(dyn, out)  # the same draws as the dynamic sampler, row by row
    for i, prompt in enumerate(prompts):
        ref_gen = torch.Generator().manual_seed(100 + i)
        ids, lps = reference_row(model, prompt, ref_gen, 1.0, eos, 14)
        assert out.response_ids[i] == ids
        assert out.log_probs[i] == pytest.approx(lps, abs=1e-4)
        # every generator advanced by max_new_tokens uniforms, in both samplers
        assert torch.equal(mine[i].get_state(), ref_gen.get_state())
        assert torch.equal(dynamic_gens[i].get_state(), ref_gen.get_state())


class PieceTokenizer:
    """A tokenizer stand-in: token t decodes to pieces[t]."""

    def __init__(self, pieces):
        self.pieces = pieces

    def __len__(self):
        return len(self.pieces)

    def batch_decode(self, seqs):
        return ["".join(self.pieces[t] for t in s) for s in seqs]


@settings(max_examples=60, deadline=None)
@given(
    pieces=st.lists(st.text("ab</", max_size=4), min_size=2, max_size=12),
    stop=st.text("ab</", min_size=0, max_size=4),
    seq=st.lists(st.integers(0, 11), min_size=1, max_size=12),
)
def test_stop_tables_equal_a_substring_search(pieces, stop, seq):
    seq = [t % len(pieces) for t in seq]
    tables = stop_tables(PieceTokenizer(pieces), [stop], len(pieces) + 1, torch.device("cpu"))
    state, ended = 0, None
    for i, t in enumerate(seq):
        if bool(tables.hit[0][state, t]):
            ended = i
            break
        state = int(tables.next_state[0][state, t])
    naive = next(
        (i for i in range(len(seq)) if stop in "".join(pieces[t] for t in seq[: i + 1])), None
    )
    assert ended == naive
    # the extra id past the tokenizer decodes to "": no hit (except for the stop string "",
    # found in any text), the state is kept
    assert bool(tables.hit[0][:, len(pieces)].any()) == (stop == "")
    if stop:
        assert tables.next_state[0][:, len(pieces)].tolist() == list(range(len(stop)))


def test_registry_empty_batch_mode_and_bad_arguments(counter_policy):
    model, tok = counter_policy
    assert set(SAMPLERS) == {"dynamic", "static"}
    assert SAMPLERS["dynamic"] is sample and SAMPLERS["static"] is sample_static
    p = prompts_of_lengths(tok, [4])
    kw = {"eos_token_id": tok.eos_token_id}
    assert sample_static(model, [], **kw) == ([], [])
    model.train()
    sample_static(model, p, max_new_tokens=2, **kw)
    assert model.training
    model.eval()
    for bad, message in [
        ({"sync_every": 0}, "sync_every must be >= 1, got 0"),
        ({"temperature": -1}, "temperature must be >= 0, got -1"),
        ({"max_new_tokens": 0}, "max_new_tokens must be >= 1, got 0"),
        ({"prefill_rows": 0}, "prefill_rows must be >= 1, got 0"),
        ({"stop_strings": ["\n"]}, "stop_strings need a tokenizer"),
        ({"generator": [torch.Generator()] * 2}, "generator has 2 entries for 1 prompts"),
    ]:
        with pytest.raises(ValueError, match=message):
            sample_static(model, p, **kw, **bad)
    with pytest.raises(ValueError, match="eos_token_id is empty"):
        sample_static(model, p, eos_token_id=[])
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        sample_static(model, [p[0], []], **kw)


@pytest.mark.slow
def test_compiled_decode_step_equals_the_dynamic_sampler(counter_policy):
    model, tok = counter_policy
    prompts = prompts_of_lengths(tok, [3, 9, 16])
    kw = {"temperature": 0.0, "max_new_tokens": 6, "eos_token_id": [-1], "compile": True}
    sta = sample_static(model, prompts, pad_token_id=tok.pad_token_id, **kw)
    again = sample_static(model, prompts, pad_token_id=tok.pad_token_id, **kw)  # reused step
    dyn = sample(model, prompts, temperature=0.0, max_new_tokens=6, eos_token_id=[-1],
                 pad_token_id=tok.pad_token_id)  # fmt: skip
    assert_same(dyn, sta)
    assert again == sta


def test_the_sampler_option_names_the_registry():
    from mcgpo.training.config import ConfigError, RolloutConfig

    assert RolloutConfig().sampler == "dynamic"
    for name in SAMPLERS:
        RolloutConfig(sampler=name).check()
    with pytest.raises(ConfigError, match=r"rollout\.sampler must be one of dynamic, static"):
        RolloutConfig(sampler="vllm").check()
    from mcgpo.rollout.decode_attention import DECODE_ATTENTIONS

    assert RolloutConfig().decode_attention == "gqa"
    for name in DECODE_ATTENTIONS:
        RolloutConfig(decode_attention=name).check()
    with pytest.raises(
        ConfigError, match=r"rollout\.decode_attention must be one of gqa, sdpa; got 'flash'"
    ):
        RolloutConfig(decode_attention="flash").check()


def test_rollout_sampler_static_plays_the_dynamic_samplers_rollouts(counter_policy):
    """collect() with ``sampler="static"`` plays the same rollouts as the dynamic sampler at
    T = 1 (both draw each row from its own generator by the same rule), with the default
    host read every 8 steps."""
    from rollout_fakes import CounterEnv

    from mcgpo.rollout import CollectOptions, collect

    model, tok = counter_policy
    opts = CollectOptions(
        group_size=3, split="train", temperature=1.0, history=2, seed=5, max_new_tokens=10
    )
    ref = collect(model, tok, CounterEnv, [0, 1], opts)
    out = collect(model, tok, CounterEnv, [0, 1], dataclasses.replace(opts, sampler="static"))
    assert list(out.table.action) == list(ref.table.action)
    assert torch.equal(out.tokens.input_ids, ref.tokens.input_ids)
    mask = ref.tokens.response_mask
    assert torch.allclose(out.tokens.old_log_probs[mask], ref.tokens.old_log_probs[mask], atol=1e-5)


def test_collect_options_refuse_an_unknown_sampler():
    from mcgpo.rollout import CollectOptions

    with pytest.raises(
        ValueError, match="sampler must be one of \\['dynamic', 'static'\\], got 'vllm'"
    ):
        CollectOptions(group_size=2, split="train", temperature=1.0, history=1, sampler="vllm")
    with pytest.raises(
        ValueError, match="decode_attention must be one of \\['gqa', 'sdpa'\\], got 'flash'"
    ):
        CollectOptions(
            group_size=2, split="train", temperature=1.0, history=1, decode_attention="flash"
        )


def test_collect_hands_decode_attention_to_the_static_sampler_only(counter_policy, monkeypatch):
    """rollout.decode_attention reaches sample_static through collect_options and collect;
    the dynamic sampler is not given it."""
    from rollout_fakes import CounterEnv

    from mcgpo.rollout import collect, turns
    from mcgpo.training.build import collect_options
    from mcgpo.training.config import RolloutConfig, RunConfig

    model, tok = counter_policy
    seen = []

    def spy(name):
        def draw(*args, **kwargs):
            seen.append((name, kwargs.get("decode_attention")))
            return SAMPLERS[name](*args, **kwargs)

        return draw

    monkeypatch.setattr(turns, "SAMPLERS", {name: spy(name) for name in SAMPLERS})
    cfg = RunConfig(rollout=RolloutConfig(sampler="static", decode_attention="sdpa"))
    opts = collect_options(cfg, "action", split="train", temperature=1.0, group_size=2, seed=0)
    assert (opts.sampler, opts.decode_attention) == ("static", "sdpa")
    opts = dataclasses.replace(opts, max_turns=1, max_new_tokens=4, max_prompt_tokens=None)
    collect(model, tok, CounterEnv, [0], opts)
    collect(model, tok, CounterEnv, [0], dataclasses.replace(opts, sampler="dynamic"))
    assert seen == [("static", "sdpa"), ("dynamic", None)]


def test_compiled_step_graphs_stay_bounded_over_calls_that_change_rows_and_buckets(
    counter_policy, monkeypatch
):
    """Issue 43 item 1: four calls whose rows (8, 3, 6, 2) and prompt widths change and
    whose steps cross 15 length buckets (8 columns each here, 256 in a run) compile at most
    3 graphs (the first shape, one for every row count >= 2, one for a single row) and never
    reach dynamo's limit; compiled as before (dynamic=False: a graph per rows, length and
    bucket) they reached its default limit of 8 within the first call and ran eagerly.
    Dynamo's graphs are counted with its "eager" backend (the same tracing and guards as
    inductor's, without the C++ compile); the tokens equal the eager step's."""
    import mcgpo.rollout.decode_step as decode_step
    import mcgpo.rollout.static_decode as sd

    model, tok = counter_policy
    monkeypatch.setattr(sd, "_COLUMN_BUCKET", 8)
    monkeypatch.setattr(sd, "_LEN_BUCKET", 8)
    monkeypatch.setattr(decode_step, "COMPILE_OPTIONS", {"backend": "eager", "dynamic": True})
    monkeypatch.setattr(decode_step, "_STEP", [])
    torch._dynamo.reset()
    assert decode_step.decode_compile_stats() == {}  # nothing compiled yet
    ids = tok("Your task is to: count to 4. The counter shows 2. step wait step " * 8)["input_ids"]
    calls = [(8, 60, 40), (3, 110, 20), (6, 20, 30), (2, 90, 25)]  # rows, width, new tokens
    kw = dict(temperature=1.0, eos_token_id=[-1], pad_token_id=tok.pad_token_id, sync_every=16)
    buckets = set()
    for rows, width, new in calls:
        prompts = [ids[: width - 3 * i] for i in range(rows)]
        compiled = sd.sample_static(
            model, prompts, max_new_tokens=new, compile=True,
            generator=torch.Generator().manual_seed(rows), **kw,
        )  # fmt: skip
        eager = sd.sample_static(
            model, prompts, max_new_tokens=new, compile=False,
            generator=torch.Generator().manual_seed(rows), **kw,
        )  # fmt: skip
        assert compiled.response_ids == eager.response_ids
        buckets |= {-(-(width + t) // 8) for t in range(1, new)}
    assert len(buckets) >= 10
    stats = decode_step.decode_compile_stats()
    assert 1 <= stats["rollout/compile_graphs"] <= 3
    assert stats["rollout/compile_limit_hit"] == 0.0
    torch._dynamo.reset()


def _weight_cast_counter(model):
    """(a torch.compile backend, the list it fills): every fp32 -> bf16 cast of a tensor of
    a matmul weight's shape in the compiled graph (AOT's aten graph, where autocast's
    casts are operations)."""
    from torch._functorch.aot_autograd import aot_module_simplified

    shapes = {tuple(p.shape) for p in model.parameters() if p.dim() == 2}
    casts: list[tuple[int, ...]] = []

    def count(graph, inputs):
        for node in graph.graph.nodes:
            name = str(node.target)
            if node.op == "call_function" and ("_to_copy" in name or "convert_element" in name):
                val = getattr(node.args[0], "meta", {}).get("val")
                if val is None or val.dtype != torch.float32:
                    continue
                shape = tuple(d if isinstance(d, int) else -1 for d in val.shape)  # symbols: -1
                if shape in shapes:
                    casts.append(shape)
        return graph

    return (lambda gm, inputs: aot_module_simplified(gm, inputs, fw_compiler=count)), casts


@pytest.mark.slow  # two AOT compilations of the tiny model: about 1 minute on 2 busy cores
def test_under_autocast_the_static_sampler_runs_on_a_bf16_copy_without_weight_casts(
    counter_policy, monkeypatch
):
    """Issue 43 item 7, measured on the CPU: a compiled one-token step over fp32 weights
    under bf16 autocast holds one fp32 -> bf16 cast per matmul weight (14 here: 7 per layer;
    the tied head's is the embedding's, which also feeds the lookup uncast), replayed at
    every decode step. The static sampler under autocast (train.precision bf16-mixed) failed
    outright before (keys fp32 after RoPE, values bf16, one StaticCache dtype); it now runs
    on a bf16 copy of the weights: no weight casts in its compiled step, exactly what a
    bf16 copy made by hand samples, and the copy follows the fp32 weights when they change."""
    import copy as copying

    import mcgpo.rollout.decode_step as decode_step
    import mcgpo.rollout.static_decode as sd
    from mcgpo.policy.precision import cast_weights

    model, tok = counter_policy
    model = copying.deepcopy(model)  # its weights change below
    backend, casts = _weight_cast_counter(model)
    step = torch.compile(lambda ids: model(input_ids=ids).logits, backend=backend)
    torch._dynamo.reset()
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        step(torch.tensor([[3], [4]]))
    assert len(casts) >= 14  # the suspected casts, as graph operations

    casts.clear()
    monkeypatch.setattr(decode_step, "COMPILE_OPTIONS", {"backend": backend, "dynamic": True})
    monkeypatch.setattr(decode_step, "_STEP", [])
    torch._dynamo.reset()
    prompts = prompts_of_lengths(tok, [12, 5, 9])
    kw = dict(temperature=1.0, max_new_tokens=8, eos_token_id=[-1], pad_token_id=tok.pad_token_id)

    def both(compiled=True):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mixed = sd.sample_static(
                model, prompts, compile=compiled, generator=torch.Generator().manual_seed(0), **kw
            )
        half = cast_weights(copying.deepcopy(model), "bf16")  # the same weights, by hand
        by_hand = sd.sample_static(half, prompts, generator=torch.Generator().manual_seed(0), **kw)
        return mixed, by_hand

    mixed, by_hand = both()
    assert casts == []  # the compiled step reads bf16 weights
    assert mixed.response_ids == by_hand.response_ids and mixed.log_probs == by_hand.log_probs
    assert next(model.parameters()).dtype == torch.float32  # the policy itself untouched
    with torch.no_grad():  # an optimiser step on the fp32 master weights
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    moved, by_hand = both(compiled=False)
    assert moved.response_ids == by_hand.response_ids and moved.log_probs == by_hand.log_probs
    assert moved.log_probs != mixed.log_probs  # the copy followed the new weights
    torch._dynamo.reset()
