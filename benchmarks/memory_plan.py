"""Print the memory plan: GB per GPU of an MCGPO update and rollout, for the recipe's models.

Computed, not measured (mcgpo.policy.memory: exact parameter counts from the configs,
activation bytes counted op by op and checked on the CPU against autograd's saved
tensors). bf16-mixed (fp32 weights, gradients and AdamW moments: 16 bytes per parameter),
an fp32 reference policy for the KL term, a micro-batch of ``--micro-rows`` rows of
``--row-tokens`` tokens, the LM head in ``--logits-chunk`` positions, and a rollout of
``--sequences`` rows of ``--row-tokens`` tokens in the KV cache. FSDP2 over n GPUs divides
the trained weights, gradients and moments by n; every GPU still holds the policy's full fp32
replica (the one mcgpo samples from and saves) and the whole fp32 reference; activations
stay per GPU.

A second table gives a colocated vLLM engine's share (``rollout.engine vllm``:
mcgpo.policy.memory.engine_memory, bf16 weights, the KV cache of the same rollout at full
context, one prefill step's activations, a fixed 1.5 GB allowance) and the peak per GPU with
it, awake through the update or asleep (``rollout.vllm_sleep``: level 2, weights and KV
freed); docs/rollout.md prints it. With vLLM, FSDP2 keeps no replica by default
(``train.fsdp_replica`` auto = false: each GPU holds 1/n of the fp32 weights);
``--vllm-replica`` prints that table with the replica kept (``train.fsdp_replica true``).

A third table (``--lora``) compares full fine-tuning with LoRA (``train.lora_rank``, ranks
``--lora-ranks``) on one GPU, on a frozen base in bf16 (``train.precision bf16``) or fp32
(bf16-mixed): the adapters and their AdamW state, the reference for free (the base with the
adapters off); docs/lora.md prints it.

    python benchmarks/memory_plan.py                 # the tables in docs/reference/memory.md, rollout.md
    python benchmarks/memory_plan.py --lora --models qwen2.5-1.5b,qwen2.5-7b   # docs/lora.md
    python benchmarks/memory_plan.py --row-tokens 5632 --models qwen3-4b,qwen3-8b
"""

from __future__ import annotations

import argparse

from mcgpo.policy.memory import GB, plan
from mcgpo.policy.shapes import SHAPES, shaped_config

GPUS = {"80 GB": 80.0, "141 GB": 141.0}


def rows(args: argparse.Namespace) -> list[list[str]]:
    """One table row per model, GPU count and checkpointing setting."""
    out = []
    for name in args.models.split(","):
        if name not in SHAPES:
            raise SystemExit(f"unknown model {name!r}; expected one of {', '.join(SHAPES)}")
        config = shaped_config(name)
        for gpus in (1, 2, 4):
            for ckpt in (False, True):
                p = plan(
                    config, gpus=gpus, checkpointing=ckpt, micro_rows=args.micro_rows,
                    row_tokens=args.row_tokens, logits_chunk=args.logits_chunk,
                    sequences=args.sequences,
                )  # fmt: skip
                peak = max(p.update_gb, p.rollout_gb)
                fits = ["yes" if peak <= size * 0.95 else "no" for size in GPUS.values()]
                out.append([
                    name, f"{p.params_b:.2f}", "1" if gpus == 1 else f"FSDP2 x{gpus}",
                    "on" if ckpt else "off", f"{p.states_gb:.1f}", f"{p.replica_gb:.1f}",
                    f"{p.ref_gb:.1f}",
                    f"{p.activations_gb:.1f}", f"{p.head_gb:.1f}", f"{p.update_gb:.1f}",
                    f"{p.rollout_gb:.1f}", *fits,
                ])  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="qwen2.5-1.5b,qwen2.5-3b,qwen2.5-7b,qwen3-4b,qwen3-8b")
    parser.add_argument("--micro-rows", type=int, default=8)
    parser.add_argument("--row-tokens", type=int, default=2048)
    parser.add_argument("--logits-chunk", type=int, default=512)
    parser.add_argument("--sequences", type=int, default=128)
    parser.add_argument(
        "--vllm-replica", action="store_true",
        help="the vLLM table with FSDP2's full replica kept (train.fsdp_replica true)",
    )  # fmt: skip
    parser.add_argument("--lora", action="store_true", help="the full vs LoRA table only")
    parser.add_argument("--lora-ranks", default="16,64")
    args = parser.parse_args()
    if args.lora:
        print_lora(args)
        return
    head = ["model", "params B", "GPUs", "ckpt", "states", "replica", "ref", "activations",
            "LM head",
            "update", "rollout", *(f"fits {k}" for k in GPUS)]  # fmt: skip
    print(
        f"GB per GPU, computed (bf16-mixed, micro-batch {args.micro_rows} x {args.row_tokens} "
        f"tokens, logits chunk {args.logits_chunk}, rollout {args.sequences} x "
        f"{args.row_tokens} tokens; fits = max(update, rollout) <= 95 % of the GPU)"
    )
    print()
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows(args):
        print("| " + " | ".join(row) + " |")
    print()
    print(
        f"rollout.engine vllm, GB per GPU: the engine's share (bf16, {args.sequences} x "
        f"{args.row_tokens} tokens of KV) and the peak with it (ckpt on; fits = the "
        "asleep peak <= 95 % of the GPU; FSDP2 "
        + ("with" if args.vllm_replica else "without")
        + " the full replica, train.fsdp_replica "
        + ("true)" if args.vllm_replica else "auto)")
    )
    print()
    head = ["model", "GPUs", "weights", "KV cache", "act. + overhead", "vLLM", "trainer resident",
            "peak awake", "peak asleep", *(f"fits {k}" for k in GPUS)]  # fmt: skip
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in engine_rows(args):
        print("| " + " | ".join(row) + " |")


def engine_rows(args: argparse.Namespace) -> list[list[str]]:
    """One row per model and GPU count: the vLLM engine's share and the peaks with it."""
    out = []
    for name in args.models.split(","):
        for gpus in (1, 2, 4, 8):
            p = plan(
                shaped_config(name), gpus=gpus, micro_rows=args.micro_rows,
                row_tokens=args.row_tokens, logits_chunk=args.logits_chunk,
                sequences=args.sequences, replica=args.vllm_replica,
            )  # fmt: skip
            e = p.engine
            awake, asleep = p.vllm_peak_gb
            fits = ["yes" if asleep <= size * 0.95 else "no" for size in GPUS.values()]
            out.append([
                name, "1" if gpus == 1 else f"FSDP2 x{gpus}", f"{e.weights_bytes / GB:.1f}",
                f"{e.kv_bytes / GB:.1f}", f"{(e.activations_bytes + e.overhead_bytes) / GB:.1f}",
                f"{p.vllm_gb:.1f}", f"{p.resident_gb:.1f}", f"{awake:.1f}", f"{asleep:.1f}", *fits,
            ])  # fmt: skip
    return out


def lora_rows(args: argparse.Namespace) -> list[list[str]]:
    """One row per model and setup: full fine-tuning (bf16-mixed, fp32 reference) and LoRA
    of each rank on a bf16 and on an fp32 base; one GPU, checkpointing on."""
    setups = [("full, bf16-mixed", 0, 4)]
    for rank in map(int, args.lora_ranks.split(",")):
        setups += [(f"LoRA r={rank}, bf16 base", rank, 2), (f"LoRA r={rank}, fp32 base", rank, 4)]
    out = []
    for name in args.models.split(","):
        if name not in SHAPES:
            raise SystemExit(f"unknown model {name!r}; expected one of {', '.join(SHAPES)}")
        for label, rank, base in setups:
            p = plan(
                shaped_config(name), micro_rows=args.micro_rows, row_tokens=args.row_tokens,
                logits_chunk=args.logits_chunk, sequences=args.sequences, lora_rank=rank,
                base_bytes=base,
            )  # fmt: skip
            peak = max(p.update_gb, p.rollout_gb)
            _, asleep = p.vllm_peak_gb
            fits = ["yes" if peak <= size * 0.95 else "no" for size in GPUS.values()]
            fits_vllm = "yes" if asleep <= 80 * 0.95 else "no"
            out.append([
                name, label, f"{p.trainable_b * 1e3:,.0f}", f"{p.states_gb:.1f}",
                f"{p.ref_gb:.1f}", f"{p.activations_gb:.1f}", f"{p.head_gb:.1f}",
                f"{p.update_gb:.1f}", f"{p.rollout_gb:.1f}", fits[0], f"{asleep:.1f}", fits_vllm,
            ])  # fmt: skip
    return out


def print_lora(args: argparse.Namespace) -> None:
    print(
        f"GB on one GPU, computed: full fine-tuning vs LoRA (bf16 compute; micro-batch "
        f"{args.micro_rows} x {args.row_tokens} tokens, checkpointing on, logits chunk "
        f"{args.logits_chunk}, rollout {args.sequences} x {args.row_tokens} tokens; fits = "
        "max(update, rollout) <= 95 % of 80 GB; vLLM peak = the engine asleep during the update)"
    )
    print()
    head = ["model", "setup", "trainable M", "weights + states", "ref", "activations",
            "LM head", "update", "rollout (HF)", "fits 80 GB", "peak with vLLM",
            "fits 80 GB (vLLM)"]  # fmt: skip
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in lora_rows(args):
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
