"""One decode step's attention: transformers' compiled-path arithmetic vs mcgpo's GQA rows.

    python benchmarks/bench_decode_attention.py [--threads 1] [--repeats 20] [--rows 16 64]

Qwen2.5-1.5B's attention shape (12 query heads over 2 KV heads, head dim 128), one query
token per row over a static cache of 512 columns in float32, a padding mask with 320 of them
attended (64 columns of left padding, 128 unfilled at the end). Three ways, each the median
of ``--repeats`` calls:

- ``repeat_kv + SDPA``: what transformers' sdpa attention runs for a masked single-token step
  under ``torch.compile`` (its eager ``pack_gqa`` shortcut is skipped there): K and V
  expanded to 12 heads, then SDPA;
- ``gqa``: :func:`mcgpo.rollout.decode_attention.gqa_decode_attention`, the 6 query heads of
  a KV head as 6 query rows, all 512 columns;
- ``gqa, bucket 384``: the same over the first 384 columns (a length bucket).

Eager on the CPU, so this shows the copy's cost on this machine, not a GPU's; the H200
numbers come from the device check (benchmarks/gpu/). Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import time

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import repeat_kv

from mcgpo.rollout.decode_attention import gqa_decode_attention

HEADS, KV_HEADS, DIM, LENGTH, FILLED, BUCKET = 12, 2, 128, 512, 320, 384


class _Attn(torch.nn.Module):
    num_key_value_groups, is_causal = HEADS // KV_HEADS, True


def _median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 64])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    group, scale = HEADS // KV_HEADS, DIM**-0.5
    print(
        f"# {datetime.date.today()}, {platform.machine()}, {os.cpu_count()} cores, "
        f"{args.threads} torch thread(s), torch {torch.__version__}, load average "
        f"{os.getloadavg()[0]:.1f}; {HEADS}/{KV_HEADS} heads, head dim {DIM}, cache {LENGTH} "
        f"columns ({FILLED} attended, the last {LENGTH - BUCKET} unfilled), float32, median of {args.repeats}"
    )
    print(
        "| rows | repeat_kv + SDPA ms | gqa ms | gqa, bucket 384 ms | repeat / gqa | max abs diff |"
    )
    print("|---|---|---|---|---|---|")
    for rows in args.rows:
        q = torch.randn(rows, HEADS, 1, DIM, generator=g)
        k = torch.randn(rows, KV_HEADS, LENGTH, DIM, generator=g)
        v = torch.randn(rows, KV_HEADS, LENGTH, DIM, generator=g)
        mask = torch.zeros(rows, 1, 1, LENGTH, dtype=torch.bool)
        mask[..., BUCKET - FILLED : BUCKET] = True  # left padding, unfilled tail

        def expanded(q=q, k=k, v=v, mask=mask):
            out = F.scaled_dot_product_attention(
                q, repeat_kv(k, group), repeat_kv(v, group), attn_mask=mask, scale=scale
            )
            return out.transpose(1, 2).contiguous()

        def rows_layout(columns=None, q=q, k=k, v=v, mask=mask):
            extra = {} if columns is None else {"decode_columns": columns}
            return gqa_decode_attention(_Attn(), q, k, v, mask, scaling=scale, **extra)[0]

        with torch.inference_mode():
            ref = expanded()
            diff = max(float((ref - rows_layout(c)).abs().max()) for c in (None, BUCKET))
            t_rep = _median_ms(expanded, args.repeats)
            t_gqa = _median_ms(rows_layout, args.repeats)
            t_bucket = _median_ms(lambda: rows_layout(BUCKET), args.repeats)
        print(
            f"| {rows} | {t_rep:.2f} | {t_gqa:.2f} | {t_bucket:.2f} | {t_rep / t_gqa:.2f}x "
            f"| {diff:.1e} |"
        )


if __name__ == "__main__":
    main()
