"""collect(): a group's rollout does not depend on the other groups of the call.

Every environment samples from its own generator, seeded from (seed, global group index,
slot) (``sampling_generators``), and the sampler draws each row from its own generator. So
a rank that plays a block of groups with ``group_offset`` = the block's first global index
samples what one process playing every group samples for them, at temperature 1.
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rollout_fakes import CounterEnv

from mcgpo.rollout import CollectOptions, collect
from mcgpo.rollout.group_rollout import sampling_generators

N = 3
OPTIONS = {"split": "train", "temperature": 1.0, "history": 2, "max_new_tokens": 6, "seed": 11}


def run(policy, tasks, offset=0):
    options = CollectOptions(group_size=N, group_offset=offset, **OPTIONS)
    return collect(*policy, CounterEnv, tasks, options)


def group_rows(out, g):
    """Group g's rows: the fields of each (slot, turn) row, its tokens and log-probs."""
    t, tb = out.table, out.tokens
    rows = np.flatnonzero(t.group == g)
    fields = [
        (int(t.slot[r]), int(t.turn[r]), str(t.action[r]), float(t.reward[r]), bool(t.done[r]),
         float(t.success[r]), str(t.anchor[r]), out.responses[r])
        for r in rows
    ]  # fmt: skip
    mask = tb.attention_mask[rows].bool()
    ids = [tb.input_ids[r][mask[i]].tolist() for i, r in enumerate(rows)]
    old = [tb.old_log_probs[r][tb.response_mask[r]] for r in rows]
    return fields, ids, old


@settings(max_examples=8, deadline=None)
@given(st.lists(st.integers(0, 8), min_size=2, max_size=4), st.data())
def test_a_group_plays_the_same_alone_or_in_any_batch(counter_policy, tasks, data):
    """Global group k of ``tasks`` (a task may repeat: another group, another stream),
    played alone with ``group_offset = k``, gives the rows it gives inside the whole batch."""
    k = data.draw(st.integers(0, len(tasks) - 1), label="k")
    whole = run(counter_policy, tasks)
    alone = run(counter_policy, [tasks[k]], offset=k)
    fields, ids, old = group_rows(whole, k)
    fields_1, ids_1, old_1 = group_rows(alone, 0)
    assert fields == fields_1 and ids == ids_1
    for a, b in zip(old, old_1, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=0)


def test_two_blocks_with_offsets_are_the_whole_batch(counter_policy):
    """What two ranks do: groups 0-1 and 2-4 collected apart equal the 5-group batch."""
    tasks = [3, 1, 4, 1, 5]
    whole = run(counter_policy, tasks)
    blocks = [(run(counter_policy, tasks[:2]), 0), (run(counter_policy, tasks[2:], 2), 2)]
    for out, start in blocks:
        for g in range(len(set(out.table.group.tolist()))):
            assert group_rows(out, g)[:2] == group_rows(whole, start + g)[:2]
    # the slots of a group draw different streams: not all siblings answer alike
    assert len({f[-1] for f in group_rows(whole, 0)[0] if f[1] == 0}) > 1


def test_generators_are_seeded_from_seed_global_group_and_slot():
    opts = CollectOptions(group_size=2, group_offset=3, **{**OPTIONS, "seed": 5})
    gens = sampling_generators(opts, groups=2)
    # environment e = g * N + slot of a call whose first group is global group 3
    for e, (g, slot) in enumerate([(3, 0), (3, 1), (4, 0), (4, 1)]):
        seed = np.random.SeedSequence([5, g, slot]).generate_state(1, dtype=np.uint64)[0]
        expected = torch.rand(4, generator=torch.Generator().manual_seed(int(seed)))
        assert torch.equal(torch.rand(4, generator=gens[e]), expected)
    # the same global group from a call that starts at 0: the same streams
    whole = sampling_generators(CollectOptions(group_size=2, **{**OPTIONS, "seed": 5}), groups=5)
    a = [torch.rand(3, generator=g) for g in sampling_generators(opts, groups=2)]
    assert all(torch.equal(x, torch.rand(3, generator=whole[6 + i])) for i, x in enumerate(a))


def test_the_seed_changes_the_rollout(counter_policy):
    a = run(counter_policy, [0, 1])
    b = collect(
        *counter_policy, CounterEnv, [0, 1], CollectOptions(group_size=N, **{**OPTIONS, "seed": 12})
    )  # fmt: skip
    assert a.responses != b.responses
