"""The parts of benchmarks/gpu_check.py, each run in a process of its own.

    PYTHONPATH=src python benchmarks/gpu_check_parts.py --part a --result FILE --work DIR [--dry]

One process per part (started and killed by gpu_check.py): it builds its model, measures, and
rewrites ``--result`` (JSON, atomically: a temporary file, then ``os.replace``) after every
group of rows, so that the rows measured before a kill or a crash survive. The file holds
``status`` (running, ok, error), ``rows`` ([measure, value, note]), ``env`` (device and
versions) and, on an error, ``why`` (one line). See gpu_check.py for what each part measures.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import io
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import throughput  # the benchmarks folder's shared measures

PRECISION = "bf16-mixed"  # the update's mixed precision (fp32 master weights, bf16 autocast)
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
DISK_CAP = 2e9  # bytes part d may write (the device machine's 64 GiB disk holds the image too)
# part d's bytes on disk per parameter: the model saved for it in bf16 (2), one checkpoint
# (fp32 weights 4 + AdamW moments 8) and the final fp32 model (4)
DISK_BYTES_PER_PARAM = 18


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


GPU = Sizes(128, 128, 16, (1024, 2048), 64, 4, 32, 64, 2)
DRY = Sizes(4, 4, 8, (24, 48), 8, 4, 4, 6, 1)
Row = list[str]  # measure, value, note


def num(x: float) -> str:
    """A table value: integers for large numbers, three significant digits otherwise."""
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and os.replace."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class Part:
    """One part's context: device, sizes, tokenizer, and the result file it keeps current."""

    def __init__(self, key: str, result: Path, work: Path, dry: bool, fault: str | None,
                 bandwidth: float, peak_flops: float) -> None:  # fmt: skip
        self.key, self.result, self.work, self.dry = key, result, work, dry
        self.device = torch.device("cpu" if dry else "cuda")
        self.sizes = DRY if dry else GPU
        self.bandwidth, self.peak_flops = bandwidth, peak_flops
        self.rows: list[Row] = []
        self.env = environment(self.device)
        self.fault, self.fault_after = (fault or "").partition("@")[::2]
        self._tokenizer: Any = None
        self.write("running")

    def write(self, status: str, why: str = "") -> None:
        payload = {"status": status, "rows": self.rows, "env": self.env, "why": why}
        atomic_write(self.result, json.dumps(payload, indent=1))

    def emit(self, *rows: tuple[str, str, str]) -> None:
        """Add rows and rewrite the result file at once (they survive a later kill)."""
        self.rows += [list(r) for r in rows]
        self.write("running")
        if self.fault and self.fault_after:
            self.inject()

    def inject(self) -> None:
        """Test-only faults (gpu_check.py --inject-fault part:kind[@1]): raise, hang, abort,
        or orphan (start a child process, write its pid as a row, hang)."""
        kind, self.fault = self.fault, ""
        if kind == "raise":
            raise RuntimeError(f"injected fault in part {self.key}")
        if kind == "hang":
            while True:  # only a kill ends this
                time.sleep(3600)
        if kind == "abort":
            os.abort()
        if kind == "orphan":  # the group kill must end this child too
            import subprocess

            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            self.emit(("child pid", str(child.pid), "injected"))
            while True:
                time.sleep(3600)
        raise ValueError(f"unknown fault {kind!r}; expected raise, hang, abort or orphan")

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from mcgpo.policy import train_tokenizer
            from mcgpo.rollout import environment_corpus

            self._tokenizer = train_tokenizer(environment_corpus(("household",), episodes=64))
        return self._tokenizer

    def config(self, **changes: Any) -> Any:
        from transformers import Qwen2Config

        tok = self.tokenizer
        shape = dict(TINY, vocab_size=len(tok)) if self.dry else dict(QWEN25_15B)
        shape.update(changes)
        return Qwen2Config(
            **shape, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )  # fmt: skip

    def model(self, dtype: torch.dtype, config: Any = None) -> Any:
        """Random weights (seed 0) of the part's shape, built on the device."""
        from transformers import AutoModelForCausalLM

        torch.manual_seed(0)
        with self.device:
            model = AutoModelForCausalLM.from_config(config or self.config(), dtype=dtype)
        model.generation_config.pad_token_id = self.tokenizer.pad_token_id
        self.env["parameters"] = sum(p.numel() for p in model.parameters())
        return model.eval()

    def sync(self) -> None:
        throughput.synchronize(self.device)

    def reset_peak(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()

    def peak_gb(self) -> float:
        """GPU: bytes allocated at the peak since reset_peak; CPU: the process's peak RSS."""
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated() / 1e9
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024 / 1e9
        return float("nan")

    @property
    def memory_kind(self) -> str:
        return "GPU allocated" if self.device.type == "cuda" else "CPU: process peak RSS"


def environment(device: torch.device) -> dict[str, Any]:
    import transformers

    name = torch.cuda.get_device_name() if device.type == "cuda" else platform.processor()
    return {
        "device": f"{device.type} {name or platform.machine()}", "cores": os.cpu_count(),
        "python": platform.python_version(), "torch": torch.__version__,
        "cuda": torch.version.cuda, "transformers": transformers.__version__,
    }  # fmt: skip


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


def time_call(part: Part, fn: Callable[[], Any], clock: PrefillClock) -> tuple[float, float]:
    """Best (whole call, its prefill) seconds over the part's repeats."""
    best = (float("inf"), 0.0)
    for _ in range(part.sizes.repeats):
        clock.seconds = 0.0
        part.sync()
        start = time.perf_counter()
        fn()
        part.sync()
        best = min(best, (time.perf_counter() - start, clock.seconds))
    return best


def part_sampler(part: Part) -> None:
    """generate, the dynamic and the static sampler; decode steps timed apart from prefill."""
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

    compiled = part.device.type == "cuda"

    def static() -> None:
        g = torch.Generator(part.device).manual_seed(0)
        sample_static(model, prompts, generator=g, compile=compiled, **common)

    where = f"{s.rows} rows, prompts {mean_prompt:.0f} tokens mean, {s.new_tokens} new"
    with prefill_timed(clock):
        generate()  # warm-up
        gen_s, _ = time_call(part, generate, clock)
        part.emit(("generate tok/s", num(tokens / gen_s), f"{where}; whole call, prefill included"))
        dynamic()
        dyn_s, dyn_pre = time_call(part, dynamic, clock)
        part.emit(
            ("dynamic decode tok/s", num(tokens / (dyn_s - dyn_pre)), "KV cache, after prefill"),
            ("dynamic prefill s", f"{dyn_pre:.3f}", f"whole call {dyn_s:.3f} s"),
        )  # fmt: skip
        note = "static cache, compiled decode step" if compiled else "static cache, eager"
        try:
            static()  # warm-up: compiles the decode step on CUDA
        except Exception as err:  # keep a number: the static sampler without compilation
            if not compiled:
                raise
            note = f"EAGER: compile failed ({type(err).__name__}: {str(err)[:120]})"
            compiled = False
            _STEPS.pop(model, None)
            static()
        st_s, st_pre = time_call(part, static, clock)
        decode = tokens / (st_s - st_pre)
        part.emit(
            ("static decode tok/s", num(decode), f"{note}; after prefill"),
            ("static prefill s", f"{st_pre:.3f}", f"whole call {st_s:.3f} s"),
            ("static / generate", f"{gen_s / st_s:.2f}", "whole calls; goal >= 3"),
            ("bandwidth bound tok/s", num(bound),
             f"(weights + KV) read once per decode step at {part.bandwidth / 1e9:.0f} GB/s"),
            ("static decode % of bound", num(100 * decode / bound),
             "decode steps only (prefill timed apart); goal >= 25"),
        )  # fmt: skip
    _STEPS.pop(model, None)


def train_flops(config: Any, lengths: list[int], responses: list[int]) -> float:
    """Model FLOPs of one forward+backward over rows of ``lengths`` real tokens whose last
    ``responses`` go through the LM head (what the update computes).

    6 x body parameters x all tokens (2 forward + 4 backward per parameter per token; the
    body is every parameter but the embedding table, whose lookup costs none, and an untied
    head) + 6 x head parameters (vocab x hidden) x response tokens + causal attention:
    QK^T and AV are each 2 x q_dim FLOPs per (query, key) pair per layer forward, 3 times
    that with the backward, over n (n + 1) / 2 pairs of a row of n tokens.
    """
    from mcgpo.policy.memory import parameter_count

    h, vocab = config.hidden_size, config.vocab_size
    head_dim = getattr(config, "head_dim", None) or h // config.num_attention_heads
    q_dim = config.num_attention_heads * head_dim
    head = vocab * h
    body = parameter_count(config) - head - (0 if config.tie_word_embeddings else head)
    pairs = sum(n * (n + 1) // 2 for n in lengths)
    attention = 12 * config.num_hidden_layers * q_dim * pairs
    return 6.0 * body * sum(lengths) + 6.0 * head * sum(responses) + attention


def update_rows(part: Part) -> Any:
    """``update_rows`` rows of random tokens: prompts in ``prompt_range``, fixed response."""
    from mcgpo.rollout import TokenBatch

    s, rng = part.sizes, np.random.default_rng(0)
    vocab = len(part.tokenizer)
    prompts = [rng.integers(0, vocab, rng.integers(*s.prompt_range)).tolist()
               for _ in range(s.update_rows)]  # fmt: skip
    responses = [rng.integers(0, vocab, s.response).tolist() for _ in prompts]
    old = [[-float(rng.uniform(0.5, 3.0)) for _ in r] for r in responses]
    return TokenBatch.from_sequences(
        prompts, responses, old, pad_token_id=part.tokenizer.pad_token_id
    )


def part_update(part: Part) -> None:
    """update_policy against the raw forward+backward over the same tokens and head positions."""
    from mcgpo.policy import token_log_probs_and_entropy
    from mcgpo.policy.memory import plan
    from mcgpo.policy.precision import compute
    from mcgpo.training.config import TrainConfig
    from mcgpo.training.setup import build_optimizer
    from mcgpo.training.update import update_policy

    s = part.sizes
    model = part.model(torch.float32)  # fp32 master weights, bf16 autocast (PRECISION)
    batch = update_rows(part)
    cfg = TrainConfig(micro_batch_size=s.micro, kl_coef=0.0, lr=1e-6, precision=PRECISION,
                      old_logprobs="sampler")  # fmt: skip
    advantages = np.random.default_rng(1).normal(size=len(batch)).astype(np.float32)
    optimizer = build_optimizer(model, cfg.lr, cfg.weight_decay)
    chunk, entropy = cfg.logits_chunk or None, cfg.entropy_coef > 0

    def raw() -> None:  # the update's forward (head on response tokens), loss-free backward
        model.train()
        model.zero_grad(set_to_none=True)
        for rows in throughput.micro_batches(batch, s.micro):
            mb = batch.select(rows).to(part.device)
            with compute(cfg.precision, part.device):
                lp, ent = token_log_probs_and_entropy(
                    model, mb.input_ids, mb.attention_mask, with_entropy=entropy,
                    chunk_size=chunk, positions=mb.response_mask, unique_rows=False,
                )  # fmt: skip
            m = mb.response_mask
            loss = ((lp + cfg.entropy_coef * ent) * m).sum() / m.sum().clamp(min=1)
            loss.backward()
        model.zero_grad(set_to_none=True)

    def update() -> None:
        update_policy(model, optimizer, batch, advantages, cfg)

    def best(fn: Callable[[], None]) -> float:
        fn()  # warm-up (allocator, kernels, AdamW state)
        part.reset_peak()
        times = throughput.best_times([fn], s.repeats, part.device)
        return times[0]

    t_raw = best(raw)
    raw_peak = part.peak_gb()
    t_update = best(update)
    update_peak = part.peak_gb()
    lengths = batch.attention_mask.sum(1).tolist()
    responses = batch.response_mask.sum(1).tolist()
    flops = train_flops(model.config, lengths, responses)
    shape = f"{s.update_rows} rows x {s.prompt_range[0]}-{s.prompt_range[1]} + {s.response} tokens"
    peak = part.peak_flops
    same = (f"same FLOPs for both: {flops / 1e12:.3g} TFLOP (6 x body params x {sum(lengths)} "
            f"tokens + 6 x head params x {sum(responses)} response tokens + causal attention) "
            f"/ {peak / 1e12:.0f} TFLOP/s")  # fmt: skip
    part.emit(
        ("fwd+bwd tok/s", num(sum(lengths) / t_raw),
         f"{shape}, micro {s.micro}, {PRECISION}; head on response tokens, no optimiser step"),
        ("fwd+bwd MFU %", num(100 * flops / t_raw / peak), same),
        ("update tok/s", num(sum(lengths) / t_update),
         "update_policy: kl_coef 0, pi_old from the batch, one AdamW step"),
        ("update MFU %", num(100 * flops / t_update / peak), "goal >= 35"),
        ("update / fwd+bwd", f"{t_raw / t_update:.2f}", "goal >= 0.80"),
        ("padding share", f"{throughput.padding_share(batch, s.micro):.3f}",
         "length-sorted micro-batches"),
    )  # fmt: skip
    widest = max(lengths)
    predicted = plan(
        model.config, gpus=1, checkpointing=cfg.gradient_checkpointing, micro_rows=s.micro,
        row_tokens=widest, logits_chunk=cfg.logits_chunk, response_tokens=s.response, kl=False,
    ).update_gb  # fmt: skip
    part.emit(
        ("update peak memory GB", num(update_peak), part.memory_kind),
        ("memory plan GB", num(predicted),
         f"mcgpo.policy.memory.plan: micro {s.micro} x {widest} tokens, no KL, no checkpointing"),
        ("measured / plan", f"{update_peak / predicted:.2f}",
         "GPU: goal near 1" if part.device.type == "cuda" else "CPU RSS: not comparable"),
        ("fwd+bwd peak memory GB", num(raw_peak), f"{part.memory_kind}; no AdamW step"),
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


def disk_bytes(folder: Path) -> int:
    """Bytes of the files under ``folder``."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def train_layers(part: Part, cap: float = DISK_CAP) -> int:
    """Most layers of the part's shape (household vocabulary) whose run fits ``cap`` on disk."""
    from mcgpo.policy.memory import parameter_count

    full = part.config(vocab_size=len(part.tokenizer)).num_hidden_layers
    for layers in range(full, 0, -1):
        params = parameter_count(
            part.config(vocab_size=len(part.tokenizer), num_hidden_layers=layers)
        )
        if DISK_BYTES_PER_PARAM * params <= 0.9 * cap:
            return layers
    raise ValueError(f"not even one layer fits {cap / 1e9:.1f} GB on disk")


def part_train(part: Part) -> None:
    """``mcgpo train``: one household update from a model saved to the work folder."""
    import shutil

    from mcgpo.cli import main
    from mcgpo.policy import save_policy
    from mcgpo.training.metrics import read_metrics

    layers = train_layers(part)
    config = part.config(vocab_size=len(part.tokenizer), num_hidden_layers=layers)
    model = part.model(torch.bfloat16, config)
    params = part.env["parameters"]
    full = part.config().num_hidden_layers
    folder = part.work / "train"
    shutil.rmtree(folder, ignore_errors=True)
    saved = save_policy(model, part.tokenizer, folder / "model")
    del model
    out = folder / "run"
    args = [
        "train", "--preset", "household-smoke", "--model", str(saved), "--out", str(out),
        "--device", part.device.type, "--train.updates", "1", "--eval.tasks", "0",
        "--progress", "false", "--train.precision", PRECISION,
    ]  # fmt: skip
    part.reset_peak()
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # the CLI's own lines: not the table
        rc = main(args)
    seconds = time.perf_counter() - start
    updates = [r for r in read_metrics(out / "metrics.jsonl") if "loss/task" in r]
    used = disk_bytes(folder)
    shutil.rmtree(folder, ignore_errors=True)
    loss = updates[-1]["loss/task"] if updates else float("nan")
    part.emit(
        ("mcgpo train exit code", str(rc),
         f"household-smoke, 1 update, eval off, --train.precision {PRECISION}"),
        ("mcgpo train model", f"{layers} of {full} layers",
         f"{params / 1e6:.1f} M parameters, household vocabulary {len(part.tokenizer)}"
         + ("" if layers == full else ": fewer layers so that its files fit "
            f"{DISK_CAP / 1e9:.0f} GB")),
        ("mcgpo train seconds", f"{seconds:.1f}", "load, rollouts, update, checkpoint"),
        ("mcgpo train loss/task", f"{loss:.4f}", f"{len(updates)} update(s) logged"),
        ("mcgpo train peak memory GB", num(part.peak_gb()), part.memory_kind),
        ("mcgpo train disk GB", num(used / 1e9),
         f"input model, checkpoint, final model (cap {DISK_CAP / 1e9:.0f} GB); deleted after"),
    )  # fmt: skip


PARTS: dict[str, Callable[[Part], None]] = {
    "a": part_sampler,
    "b": part_update,
    "c": part_pi_old,
    "d": part_train,
}


def one_line(err: BaseException) -> str:
    """``Type: first line of the message (file:line)``, at most 300 characters."""
    tb = traceback.extract_tb(err.__traceback__)
    where = f" ({Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}{where}"[:300]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", required=True, choices=sorted(PARTS))
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--dry", action="store_true")
    parser.add_argument("--fault", default=None)
    parser.add_argument("--bandwidth", type=float, default=throughput.H200_BYTES_PER_S)
    parser.add_argument("--peak-flops", type=float, default=throughput.H200_BF16_FLOPS)
    args = parser.parse_args(argv)
    part = Part(args.part, args.result, args.work, args.dry, args.fault, args.bandwidth,
                args.peak_flops)  # fmt: skip
    if part.device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    try:
        if part.fault and not part.fault_after:
            part.inject()
        PARTS[args.part](part)
        part.sync()  # an asynchronous CUDA error surfaces here, inside this part
    except Exception as err:
        part.write("error", one_line(err))
        traceback.print_exc()
        return 1
    part.write("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
