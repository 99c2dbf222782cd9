"""The device check's state and its report: the parts' rows as a markdown table, the JSON and
each part's output, written atomically to ``$OUT`` (benchmarks/gpu/gpu_check.py). Standard
library only."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import time
from pathlib import Path
from typing import Any

LOG_TAIL = 6000  # characters of each part's output kept in $OUT/gpu_check.log


TITLES = {"a": "sampling", "b": "update", "c": "pi_old under bf16", "d": "mcgpo train",
          "e": "update, compiled layers", "f": "what training runs"}  # fmt: skip


def _static_rows(attention: str) -> list[str]:
    return [f"static decode tok/s, {attention}", f"static prefill s, {attention}",
            f"static / generate, {attention}", f"static decode % of bound, {attention}"]  # fmt: skip


def _compiled_rows(precision: str) -> list[str]:
    return [f"update MFU %, {precision}, eager layers", f"update MFU %, {precision}, compiled layers",
            f"compiled / eager update speed, {precision}", f"first compiled update s, {precision}",
            f"graphs compiled, {precision}", f"update peak memory GB, {precision}, compiled layers"]  # fmt: skip


def _train_rows(run: str) -> list[str]:
    return [f"mcgpo train {m}, {run}" for m in ("exit code", "seconds", "loss/task", "peak memory GB")]  # fmt: skip


# every part's rows, in the order it writes them (the dry run checks this)
MEASURES = {
    "a": ["generate tok/s", "dynamic decode tok/s", "dynamic prefill s", "bandwidth bound tok/s",
          *_static_rows("sdpa"), *_static_rows("gqa"), "gqa / sdpa decode tok/s",
          "gqa vs sdpa: tokens equal %", "gqa vs sdpa: first tokens equal %",
          "gqa vs sdpa: max abs dlogp, common prefix"],
    "b": ["fwd+bwd tok/s", "fwd+bwd MFU %", "update tok/s", "update MFU %", "update / fwd+bwd",
          "padding share", "update peak memory GB", "memory plan GB", "measured / plan",
          "fwd+bwd peak memory GB"],
    "c": ["max abs dlogp, sampler vs bf16 fwd", "max abs dlogp, sampler vs fp32+autocast fwd",
          "d spread (SD), sampler's pi_old", "d spread (SD), recomputed pi_old"],
    "d": ["mcgpo train model", *_train_rows("defaults"), *_train_rows("switches off"),
          "mcgpo train disk GB"],
    "e": [*_compiled_rows("bf16-mixed"), *_compiled_rows("bf16")],
    "f": [*(m for c in (1, 2, 3) for m in (f"static call {c} s, bf16-mixed",
            f"static call {c} tok/s", f"dynamic call {c} tok/s",
            f"static call {c} graphs so far")),
          "static recompile limit reached", "static decode % of bound, slowest call",
          "update MFU %, checkpointing, eager layers",
          "update MFU %, checkpointing, compiled layers", "graphs compiled, checkpointing",
          "gradient gap / scale, compiled vs eager", "FSDP2 world 1 update MFU %, bf16-mixed",
          "TF32 on after setup", "vLLM on CUDA"],
}  # fmt: skip
# sampling first (its compiles are the slowest start), what training runs next, the train
# run last
ORDER = "afebcd"


@dataclasses.dataclass
class PartState:
    key: str
    status: str = "pending"  # pending, running, ok, error, timeout, died, skipped, interrupted
    rows: list[list[str]] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    limit_s: float = 0.0  # its limit, counted from the end of its start-up
    startup_s: float = 0.0  # seconds from its launch to its first result write
    why: str = ""
    pid: int | None = None  # the part's process (its group leader), once started


@dataclasses.dataclass
class State:
    dry: bool
    budget_s: float
    out: Path | None
    parts: dict[str, PartState]
    started: float = dataclasses.field(default_factory=time.monotonic)
    env: dict[str, Any] = dataclasses.field(default_factory=dict)
    wheels: list[str] = dataclasses.field(default_factory=list)
    logs: dict[str, str] = dataclasses.field(default_factory=dict)  # each part's output, tail
    finished: bool = False

    def elapsed(self) -> float:
        return time.monotonic() - self.started


def table(state: State) -> str:
    env = state.env
    kind = "CPU dry run, tiny models" if state.dry else "Qwen2.5-1.5B shape"
    head = (
        f"{datetime.date.today()}, {env.get('device', '?')}, {env.get('cores', '?')} cores, "
        f"Python {env.get('python', '?')}, torch {env.get('torch', '?')} (CUDA "
        f"{env.get('cuda')}), transformers {env.get('transformers', '?')}; "
        f"{state.elapsed():.0f} s of a {state.budget_s:.0f} s budget"
        + ("" if state.finished else " (RUNNING: partial table)")
    )
    if state.wheels:
        head += f"; carried wheels: {', '.join(state.wheels)}"
    lines = [f"# gpu_check ({kind})", "", head, "", "| part | measure | value | note |",
             "|---|---|---|---|"]  # fmt: skip
    for key in ORDER:
        if key not in state.parts:
            continue
        p = state.parts[key]
        rows = list(p.rows)
        have = {r[0] for r in rows}
        if p.status != "ok":
            rows += [[m, p.status.upper(), ""] for m in MEASURES[key] if m not in have]
        note = (f"{p.seconds:.1f} s ({p.startup_s:.1f} s start-up, then a {p.limit_s:.0f} s "
                "limit)" if p.limit_s else "")  # fmt: skip
        note = "; ".join(x for x in (note, p.why) if x)
        rows.append([f"part {key}: {TITLES[key]}", p.status, note])
        for m, v, n in rows:
            lines.append(f"| {key} | {m} | {v} | {n.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def write_outputs(state: State) -> None:
    """The markdown table and the JSON, each through a temporary file and os.replace."""
    if state.out is None:
        return
    state.out.mkdir(parents=True, exist_ok=True)
    payload = {
        "dry_run": state.dry, "budget_s": state.budget_s, "elapsed_s": round(state.elapsed(), 1),
        "finished": state.finished, "env": state.env, "wheels": state.wheels,
        "parts": {k: dataclasses.asdict(p) for k, p in state.parts.items()},
    }  # fmt: skip
    logs = "".join(f"===== part {k}: {TITLES[k]} (last {LOG_TAIL} characters)\n{v}\n"
                   for k, v in state.logs.items())  # fmt: skip
    for name, text in (
        ("gpu_check.md", table(state)),
        ("gpu_check.json", json.dumps(payload, indent=1)),
        ("gpu_check.log", logs),
    ):
        tmp = state.out / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, state.out / name)
