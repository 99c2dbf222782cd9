"""What every part of the device check shares: its context (device, sizes, tokenizer, result
file), the model shapes, the household prompts, and how a row says a switch is missing or a
goal is met. Imported by gpu_check_parts.py and the part modules (gpu_check_sampling.py,
gpu_check_update.py, gpu_check_train.py), in the part's own process.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
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
MISSING = "missing"  # a row's value when the switch it measures is not in this checkout


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


def accepts(fn: Callable[..., Any], keyword: str) -> bool:
    """Whether ``fn`` takes ``keyword`` (a switch another change adds: absent before it)."""
    return keyword in inspect.signature(fn).parameters


def has_field(config: type, name: str) -> bool:
    """Whether the config dataclass ``config`` has the field ``name``."""
    return name in {f.name for f in dataclasses.fields(config)}


def goal(text: str, met: bool, judged: bool) -> str:
    """A row's note on its goal: ``goal >= 30; met`` (``NOT met``); the verdict left out
    where it means nothing (the CPU dry run's tiny models)."""
    if not judged:
        return f"goal {text}"
    return f"goal {text}; {'met' if met else 'NOT met'}"


def one_line(err: BaseException) -> str:
    """``Type: first line of the message (file:line)``, at most 300 characters."""
    tb = traceback.extract_tb(err.__traceback__)
    where = f" ({Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}{where}"[:300]


class Part:
    """One part's context: device, sizes, tokenizer, and the result file it keeps current.

    Building it imports torch and transformers and (on a GPU) opens the CUDA context: the
    part's start-up. Its first write of the result file (status ``running``) tells
    gpu_check.py that the start-up is over; the part's time limit counts from there."""

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

    @property
    def judged(self) -> bool:
        """Whether goals are judged (the Qwen2.5-1.5B shape on a GPU, not the dry run)."""
        return not self.dry

    def write(self, status: str, why: str = "") -> None:
        payload = {"status": status, "rows": self.rows, "env": self.env, "why": why}
        atomic_write(self.result, json.dumps(payload, indent=1))

    def emit(self, *rows: tuple[str, str, str]) -> None:
        """Add rows and rewrite the result file at once (they survive a later kill)."""
        self.rows += [list(r) for r in rows]
        self.write("running")
        if self.fault and self.fault_after:
            self.inject()

    def missing(self, switch: str, *measures: str) -> None:
        """Rows for measures whose switch this checkout lacks: ``missing``, not a crash."""
        self.emit(*((m, MISSING, f"no {switch} in this checkout") for m in measures))

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
