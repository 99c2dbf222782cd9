"""Device check of the GPU path (issue 16): one table in a few minutes on one H200.

    PYTHONPATH=src python benchmarks/gpu_check.py [--cpu-dry-run] [--budget-s 450]

Builds a Qwen2.5-1.5B-shaped model from its config (Qwen2ForCausalLM: hidden 1536, 28
layers, 12 heads, 2 key/value heads, MLP 8960, vocabulary 151936, rope theta 1e6, tied
embeddings) with random weights in bf16 and a tokenizer trained offline on household text
(nothing is downloaded), then measures:

a. sampling: tokens/s of ``model.generate``, the dynamic KV-cache sampler and the static
   sampler (compiled decode step) at 128 sequences of household prompts, against the
   memory-bandwidth bound (weights + KV cache read once per decode step, 4.8 TB/s);
b. the update: raw forward+backward and ``update_policy`` tokens/s, MFU and peak memory on
   a slice of a 16 x 8 update's shapes (16 rows of 1-2k prompt tokens + 64 response
   tokens, micro-batches of 4), fp32 master weights with bf16 autocast (``PRECISION``);
c. pi_old under bf16: max / mean |delta log p| between the sampler's log-probs and the
   training forward (bf16 weights, and fp32 master + bf16 autocast), and the spread of
   d = mean(log pi - log pi_old) at theta = theta_old with the sampler's pi_old and with
   pi_old recomputed by the training forward;
d. one complete ``mcgpo train`` update on household (household-smoke preset: 2 x 4, 3 turns,
   eval off) from that model saved to a temporary folder, in-process through
   ``mcgpo.cli.main`` with ``--device cuda``.

Every part runs under its own time limit inside a global budget; an error or a timeout is
printed in that part's rows and the next part runs. The table is printed as markdown and
written to ``$OUT/gpu_check.md`` when ``OUT`` is set. ``--cpu-dry-run`` runs every part on
the CPU with a tiny model of the same class (seconds; tests/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import datetime
import io
import os
import platform
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import throughput  # the benchmarks folder's shared measures

# The mixed-precision convention of the update (issue 16 item 1). The train.precision option
# of the trainer is passed to part d when that option exists.
PRECISION = "bf16-mixed"
QWEN25_15B = {
    "hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12,
    "num_key_value_heads": 2, "intermediate_size": 8960, "vocab_size": 151936,
    "rope_theta": 1e6, "tie_word_embeddings": True, "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
}  # fmt: skip
TINY = {
    "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 128, "rope_theta": 1e6,
    "tie_word_embeddings": True, "max_position_embeddings": 4096,
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Sizes:
    rows: int  # sampler batch
    new_tokens: int  # tokens per sampled row
    update_rows: int  # rows of the update slice
    prompt_range: tuple[int, int]  # prompt tokens of an update row
    response: int  # response tokens of an update row
    micro: int  # rows per micro-batch
    pi_rows: int  # rows of the pi_old check
    pi_tokens: int
    repeats: int
    limits: dict[str, float]  # seconds per part


GPU = Sizes(128, 128, 16, (1024, 2048), 64, 4, 32, 64, 2,
            {"a": 240, "b": 120, "c": 60, "d": 180})  # fmt: skip
DRY = Sizes(4, 4, 8, (24, 48), 8, 4, 4, 6, 1, {"a": 60, "b": 30, "c": 30, "d": 60})


class PartTimeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise PartTimeout in the main thread after ``seconds`` (SIGALRM)."""

    def fire(signum: int, frame: Any) -> None:
        raise PartTimeout(f"over its {seconds:.0f} s limit")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, max(1.0, seconds))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@dataclasses.dataclass
class Check:
    """What every part shares: the device, the sizes, the model and its tokenizer."""

    dry: bool
    device: torch.device
    sizes: Sizes
    model: Any = None
    tokenizer: Any = None
    bandwidth: float = throughput.H200_BYTES_PER_S
    peak_flops: float = throughput.H200_BF16_FLOPS

    def autocast(self) -> Any:
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def reset_peak(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()

    def peak_gib(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated() / 2**30
        with open("/proc/self/status") as fh:  # the process's peak resident memory
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 2**20
        return float("nan")


def build(check: Check) -> None:
    """The model (random weights, bf16) and a household tokenizer, both built offline."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from mcgpo.policy import train_tokenizer
    from mcgpo.rollout import environment_corpus

    tok = train_tokenizer(environment_corpus(("household",), episodes=64))
    shape = dict(TINY, vocab_size=len(tok)) if check.dry else QWEN25_15B
    config = Qwen2Config(
        **shape, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    with check.device:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config.pad_token_id = tok.pad_token_id
    check.model, check.tokenizer = model.eval(), tok


def household_prompts(tokenizer: Any, n: int) -> list[list[int]]:
    """``n`` distinct household states (tasks 0.. after 0-3 expert steps), encoded."""
    import mcgpo
    from mcgpo.rollout import encode_prompt, render_prompt

    env, prompts = mcgpo.make_env("household"), []
    for i in range(n):
        obs, past = env.reset(seed=i, split="train"), []
        for _ in range(i % 4):
            action = env.expert_action()
            past.append((obs.text, action))
            obs = env.step(action).observation
        prompts.append(encode_prompt(tokenizer, render_prompt(obs, past)))
    return prompts


Row = tuple[str, str, str]  # measure, value, note


def num(x: float) -> str:
    """A table value: integers for large numbers, three significant digits otherwise."""
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


def part_sampler(check: Check) -> list[Row]:
    s, model = check.sizes, check.model
    prompts = household_prompts(check.tokenizer, s.rows)
    kw = {"new_tokens": s.new_tokens, "pad_token_id": check.tokenizer.pad_token_id,
          "bandwidth": check.bandwidth, "repeats": s.repeats}  # fmt: skip
    compiled = check.device.type == "cuda"
    static_note = "static cache, compiled decode step" if compiled else "static cache, eager"
    try:
        speeds = throughput.sampler_speeds(model, prompts, compile=compiled, **kw)
    except Exception as err:  # keep a number: the static sampler without compilation
        if not compiled:
            raise
        static_note = f"EAGER: compile failed ({type(err).__name__}: {str(err)[:120]})"
        speeds = throughput.sampler_speeds(model, prompts, compile=False, **kw)
    from mcgpo.rollout.static_decode import _STEPS

    _STEPS.pop(model, None)  # free the static cache
    bound = speeds["bound_tok_s"]
    where = f"{s.rows} rows, prompts {speeds['mean_prompt']:.0f} tokens mean, {s.new_tokens} new"
    return [
        ("generate tok/s", num(speeds['generate_tok_s']), where),
        ("dynamic sampler tok/s", num(speeds['dynamic_tok_s']), "KV cache, rows leave"),
        ("static sampler tok/s", num(speeds['static_tok_s']), static_note),
        ("static / generate", f"{speeds['static_tok_s'] / speeds['generate_tok_s']:.2f}",
         "goal >= 3"),
        ("bandwidth bound tok/s", num(bound),
         f"(weights + KV) per step at {check.bandwidth / 1e9:.0f} GB/s"),
        ("static % of bound", num(100 * speeds['static_tok_s'] / bound),
         "goal >= 25; prefill included"),
    ]  # fmt: skip


def update_rows(check: Check) -> Any:
    """``update_rows`` rows of random tokens: prompts in ``prompt_range``, fixed response."""
    from mcgpo.rollout import TokenBatch

    s, rng = check.sizes, np.random.default_rng(0)
    vocab = len(check.tokenizer)
    prompts = [rng.integers(0, vocab, rng.integers(*s.prompt_range)).tolist()
               for _ in range(s.update_rows)]  # fmt: skip
    responses = [rng.integers(0, vocab, s.response).tolist() for _ in prompts]
    old = [[-float(rng.uniform(0.5, 3.0)) for _ in r] for r in responses]
    return TokenBatch.from_sequences(
        prompts, responses, old, pad_token_id=check.tokenizer.pad_token_id
    )


def part_update(check: Check) -> list[Row]:
    """fp32 master weights + bf16 autocast: raw forward+backward vs update_policy."""
    from mcgpo.training.config import TrainConfig

    s = check.sizes
    model = check.model.float()  # master weights; the sampler parts ran in bf16 before
    batch = update_rows(check)
    cfg = TrainConfig(micro_batch_size=s.micro, kl_coef=0.0, lr=1e-6)
    advantages = np.random.default_rng(1).normal(size=len(batch)).astype(np.float32)
    check.reset_peak()
    eff = throughput.update_efficiency(
        model, batch, advantages, cfg, repeats=s.repeats, autocast=check.autocast
    )
    peak = check.peak_gib()
    params = sum(p.numel() for p in model.parameters())
    shape = f"{s.update_rows} rows x {s.prompt_range[0]}-{s.prompt_range[1]} + {s.response} tokens"
    model.to(torch.bfloat16)
    return [
        ("fwd+bwd tok/s", num(eff['raw_tok_s']), f"{shape}, micro {s.micro}, {PRECISION}"),
        ("fwd+bwd MFU %", num(100 * throughput.mfu(params, eff['tokens'], eff['raw_s'], check.peak_flops)),
         f"6 x {params / 1e9:.2f} G params x tokens / {check.peak_flops / 1e12:.0f} TFLOP/s; goal >= 35"),
        ("update tok/s", num(eff['update_tok_s']), "update_policy, kl_coef 0, one AdamW step"),
        ("update MFU %", num(100 * throughput.mfu(params, eff['tokens'], eff['update_s'], check.peak_flops)), ""),
        ("update / fwd+bwd", f"{eff['ratio']:.2f}", "goal >= 0.80"),
        ("padding share", f"{eff['padding']:.3f}", "length-sorted micro-batches"),
        ("peak memory GiB", f"{peak:.2f}", "GPU allocated" if check.device.type == "cuda" else "process RSS"),
    ]  # fmt: skip


def _row_means(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum(1) / mask.sum(1).clamp(min=1)


def part_pi_old(check: Check) -> list[Row]:
    """Sampler log-probs (bf16, KV cache) against the training forward at theta = theta_old."""
    from mcgpo.policy import token_log_probs
    from mcgpo.rollout import TokenBatch, sample

    s, model, tok = check.sizes, check.model, check.tokenizer
    prompts = household_prompts(tok, s.pi_rows)
    out = sample(
        model, prompts, temperature=1.0, max_new_tokens=s.pi_tokens, eos_token_id=[-1],
        pad_token_id=tok.pad_token_id, generator=torch.Generator(check.device).manual_seed(0),
    )  # fmt: skip
    batch = TokenBatch.from_sequences(prompts, out.response_ids, out.log_probs, pad_token_id=tok.pad_token_id).to(check.device)  # fmt: skip
    mask = batch.response_mask.float()

    def forward(m: Any, rows: int, autocast: bool = False) -> torch.Tensor:
        parts = []
        for k in range(0, len(batch), rows):
            mb = batch.select(np.arange(k, min(k + rows, len(batch))))
            with torch.no_grad(), check.autocast() if autocast else contextlib.nullcontext():
                lp = token_log_probs(m, mb.input_ids, mb.attention_mask)
            parts.append(torch.nn.functional.pad(lp, (0, batch.input_ids.shape[1] - lp.shape[1])))
        return torch.cat(parts)

    train_bf16 = forward(model, s.micro)
    master = copy.deepcopy(model).float()
    train_mixed = forward(master, s.micro, autocast=True)
    del master
    recomputed = forward(model, len(batch))  # pi_old by the training forward, whole batch
    rows: list[Row] = []
    for name, train in (("bf16", train_bf16), ("fp32+autocast", train_mixed)):
        delta = (train - batch.old_log_probs).abs()[batch.response_mask]
        rows.append((f"max abs dlogp, sampler vs {name} fwd", f"{float(delta.max()):.4f}",
                     f"mean {float(delta.mean()):.5f}; {s.pi_rows} rows x {s.pi_tokens} tokens"))  # fmt: skip
    for name, old in (("sampler's", batch.old_log_probs), ("recomputed", recomputed)):
        d = _row_means(train_bf16 - old, mask)
        rows.append((f"d spread (SD), {name} pi_old", f"{float(d.std()):.2e}",
                     f"max abs d {float(d.abs().max()):.2e}; theta = theta_old, micro {s.micro}"))  # fmt: skip
    return rows


def part_train(check: Check) -> list[Row]:
    """``mcgpo train``: one household update from the model saved to a temporary folder."""
    from mcgpo.cli import main
    from mcgpo.policy import save_policy
    from mcgpo.training.config import TrainConfig
    from mcgpo.training.metrics import read_metrics

    names = {f.name for f in dataclasses.fields(TrainConfig)}
    flags = ["--train.precision", PRECISION] if "precision" in names else []
    with tempfile.TemporaryDirectory() as tmp:
        folder = save_policy(check.model, check.tokenizer, Path(tmp) / "model")
        out = Path(tmp) / "run"
        args = [
            "train", "--preset", "household-smoke", "--model", str(folder), "--out", str(out),
            "--device", check.device.type, "--train.updates", "1", "--eval.tasks", "0",
            "--progress", "false", *flags,
        ]  # fmt: skip
        threads = torch.get_num_threads()
        check.reset_peak()
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):  # the CLI's own lines: not the table
            rc = main(args)
        seconds = time.perf_counter() - start
        torch.set_num_threads(threads)
        updates = [r for r in read_metrics(out / "metrics.jsonl") if "loss/task" in r]
    loss = updates[-1]["loss/task"] if updates else float("nan")
    note = " ".join(flags) or "train.precision not an option yet: default precision"
    return [
        ("mcgpo train exit code", str(rc), f"household-smoke, 1 update, eval off; {note}"),
        ("mcgpo train seconds", f"{seconds:.1f}", "load, rollouts, update, checkpoint"),
        ("mcgpo train loss/task", f"{loss:.4f}", f"{len(updates)} update(s) logged"),
        ("mcgpo train peak memory GiB", f"{check.peak_gib():.2f}", ""),
    ]


PARTS: dict[str, tuple[str, Callable[[Check], list[Row]]]] = {
    "a": ("sampling", part_sampler),
    "c": ("pi_old under bf16", part_pi_old),
    "b": ("update", part_update),
    "d": ("mcgpo train", part_train),
}  # run order: b turns the weights into fp32 masters and back, after a and c used bf16
MEASURES = {
    "a": ["generate tok/s", "dynamic sampler tok/s", "static sampler tok/s", "static / generate",
          "bandwidth bound tok/s", "static % of bound"],
    "b": ["fwd+bwd tok/s", "fwd+bwd MFU %", "update tok/s", "update MFU %", "update / fwd+bwd",
          "padding share", "peak memory GiB"],
    "c": ["max abs dlogp, sampler vs bf16 fwd",
          "max abs dlogp, sampler vs fp32+autocast fwd",
          "d spread (SD), sampler's pi_old", "d spread (SD), recomputed pi_old"],
    "d": ["mcgpo train exit code", "mcgpo train seconds", "mcgpo train loss/task",
          "mcgpo train peak memory GiB"],
}  # fmt: skip


def run_parts(check: Check, budget_s: float) -> dict[str, list[Row]]:
    """Every part under min(its limit, what is left of the budget); errors become rows."""
    deadline = time.monotonic() + budget_s
    results: dict[str, list[Row]] = {}
    for key, (title, fn) in PARTS.items():
        left = deadline - time.monotonic()
        limit = min(check.sizes.limits[key], left)
        if left < 5:
            results[key] = [(m, "skipped", "global time budget spent") for m in MEASURES[key]]
            continue
        start = time.monotonic()
        try:
            with time_limit(limit):
                results[key] = fn(check)
        except Exception as err:  # one part's failure must not stop the others
            where = traceback.extract_tb(err.__traceback__)[-1]
            why = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            why = f"{why} ({Path(where.filename).name}:{where.lineno})"[:300]
            results[key] = [
                (m, "error", why if i == 0 else "") for i, m in enumerate(MEASURES[key])
            ]
        results[key].append((f"part {key} seconds", f"{time.monotonic() - start:.1f}", title))
    return results


def table(check: Check, results: dict[str, list[Row]], seconds: float) -> str:
    import transformers

    name = torch.cuda.get_device_name() if check.device.type == "cuda" else platform.processor()
    params = sum(p.numel() for p in check.model.parameters()) if check.model is not None else 0
    lines = [
        f"# gpu_check {'(CPU dry run, tiny model)' if check.dry else '(Qwen2.5-1.5B shape, bf16)'}",
        "",
        f"{datetime.date.today()}, {check.device.type} {name or platform.machine()}, "
        f"{os.cpu_count()} cores, torch {torch.__version__}, transformers "
        f"{transformers.__version__}; {params / 1e6:.1f} M parameters; {seconds:.0f} s in all",
        "",
        "| part | measure | value | note |",
        "|---|---|---|---|",
    ]
    for key in sorted(results):
        lines += [f"| {key} | {m} | {v} | {n.replace('|', '/')} |" for m, v, n in results[key]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-dry-run", action="store_true", help="tiny model on the CPU")
    parser.add_argument("--budget-s", type=float, default=450.0, help="all parts together")
    parser.add_argument(
        "--bandwidth-gbs", type=float, default=None,
        help="memory bandwidth for the decode bound, GB/s (default: H200 4800; dry run 20)",
    )  # fmt: skip
    parser.add_argument(
        "--peak-tflops", type=float, default=None,
        help="peak FLOP/s for MFU, TFLOP/s (default: H200 dense bf16 989; dry run 1)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if not args.cpu_dry_run and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (use --cpu-dry-run on a CPU)", file=sys.stderr)
        return 2
    start = time.monotonic()
    check = Check(args.cpu_dry_run, torch.device("cpu" if args.cpu_dry_run else "cuda"),
                  DRY if args.cpu_dry_run else GPU)  # fmt: skip
    if args.bandwidth_gbs or args.cpu_dry_run:
        check.bandwidth = (args.bandwidth_gbs or 20.0) * 1e9
    if args.peak_tflops or args.cpu_dry_run:
        check.peak_flops = (args.peak_tflops or 1.0) * 1e12
    if check.device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    try:
        build(check)
    except Exception as err:  # still one table, every row saying why
        why = f"model build failed: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
        results = {key: [(m, "error", why) for m in MEASURES[key]] for key in PARTS}
    else:
        results = run_parts(check, args.budget_s - (time.monotonic() - start))
    text = table(check, results, time.monotonic() - start)
    print(text, end="")
    if os.environ.get("OUT"):
        from mcgpo.training.checkpoint import atomic_write_text

        folder = Path(os.environ["OUT"])
        folder.mkdir(parents=True, exist_ok=True)  # the device machine's $OUT exists; a
        atomic_write_text(folder / "gpu_check.md", text)  # local OUT=... may not yet
    return 0


if __name__ == "__main__":
    sys.exit(main())
