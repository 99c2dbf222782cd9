"""Device check of the GPU path (issues 16, 26): one table in under 8 minutes on one H200.

    PYTHONPATH=src python3 benchmarks/gpu_check.py [--cpu-dry-run] [--budget-s 450]

Builds Qwen2.5-1.5B-shaped models from the config (Qwen2ForCausalLM: hidden 1536, 28 layers,
12 heads, 2 key/value heads, MLP 8960, vocabulary 151936, rope theta 1e6, tied embeddings)
with random weights and a tokenizer trained offline on household text (nothing is
downloaded), and measures (benchmarks/gpu_check_parts.py):

a. sampling at 128 household prompts x 128 new tokens: ``model.generate`` (whole call), the
   dynamic KV-cache sampler and the static sampler (compiled decode step) with their decode
   steps timed apart from their prefill, against the memory-bandwidth bound of decoding;
b. the update: ``update_policy`` and the raw forward+backward over the same tokens (body on
   every token, LM head on the response tokens, as the update runs it), tokens/s and MFU
   from the same FLOP count, and the update's peak memory beside the memory plan's;
c. pi_old under bf16: |delta log p| between the sampler and the training forward, and the
   spread of d at theta = theta_old;
d. one ``mcgpo train`` update on household (household-smoke preset) with a model of the
   1.5B's layers cut to fit 2 GB of files.

Every part runs in a process of its own (its own process group) under a hard wall-clock limit:
past it the group is killed with SIGKILL. A part's rows are written to ``$OUT/gpu_check.md``
and ``$OUT/gpu_check.json`` (atomically) as soon as the part ends, and a killed or crashed
part keeps the rows it measured before; the end of each part's output goes to
``$OUT/gpu_check.log``. The whole check has a budget (``--budget-s``, 450 s
by default, imports and compiles included); a part that cannot get its minimum time within
what is left is skipped, and its rows say so. Before anything, every runtime dependency of
pyproject.toml must be importable, from the environment or from wheels carried in
``--wheels`` (default ``.whl``, made by benchmarks/gpu_wheels.sh; installed with pip
--no-index into a temporary folder); a missing one ends the check with one line, exit 2.
``--cpu-dry-run`` runs the same machinery with tiny models on the CPU (seconds;
tests/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check_deps as deps  # standard library only: runs before torch is imported

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PARTS_SCRIPT = HERE / "gpu_check_parts.py"
TITLES = {"a": "sampling", "b": "update", "c": "pi_old under bf16", "d": "mcgpo train"}
MEASURES = {
    "a": ["generate tok/s", "dynamic decode tok/s", "dynamic prefill s", "static decode tok/s",
          "static prefill s", "static / generate", "bandwidth bound tok/s",
          "static decode % of bound"],
    "b": ["fwd+bwd tok/s", "fwd+bwd MFU %", "update tok/s", "update MFU %", "update / fwd+bwd",
          "padding share", "update peak memory GB", "memory plan GB", "measured / plan",
          "fwd+bwd peak memory GB"],
    "c": ["max abs dlogp, sampler vs bf16 fwd", "max abs dlogp, sampler vs fp32+autocast fwd",
          "d spread (SD), sampler's pi_old", "d spread (SD), recomputed pi_old"],
    "d": ["mcgpo train exit code", "mcgpo train model", "mcgpo train seconds",
          "mcgpo train loss/task", "mcgpo train peak memory GB", "mcgpo train disk GB"],
}  # fmt: skip
ORDER = "acbd"  # sampling first (its compile is the slowest start), the train run last
# seconds per part (limit) and the least a part is started with (minimum), GPU and dry run:
# 200 + 90 + 60 + 90 = 440 s within the 450 s default budget
LIMITS = {"gpu": {"a": 200, "b": 90, "c": 60, "d": 90}, "dry": {"a": 60, "b": 60, "c": 60, "d": 60}}
MINIMUM = {"gpu": 30.0, "dry": 3.0}
FAULTS = ("raise", "hang", "abort", "orphan")
REAP_S = 30.0  # seconds to wait for a killed part to exit
LOG_TAIL = 6000  # characters of each part's output kept in $OUT/gpu_check.log
H200_GBS, H200_TFLOPS = 4800.0, 989.0  # throughput.py's datasheet figures
DRY_GBS, DRY_TFLOPS = 20.0, 1.0


class CheckError(ValueError):
    """Bad arguments or a missing dependency: one line, exit 2."""


@dataclasses.dataclass
class PartState:
    key: str
    status: str = "pending"  # pending, running, ok, error, timeout, died, skipped, interrupted
    rows: list[list[str]] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    limit_s: float = 0.0
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


def parse_pairs(values: list[str], what: str, kinds: tuple[str, ...] | None) -> dict[str, str]:
    """``part:value`` or ``part=value`` items (comma lists allowed) -> {part: value}."""
    out = {}
    for item in ",".join(values).split(","):
        if not item:
            continue
        key, sep, value = item.replace("=", ":", 1).partition(":")
        if not sep or key not in TITLES or not value:
            raise CheckError(f"bad {what} {item!r}: expected PART:VALUE with PART in a, b, c, d")
        if kinds is not None and value.partition("@")[0] not in kinds:
            raise CheckError(f"bad {what} {item!r}: kind must be one of {', '.join(kinds)}")
        out[key] = value
    return out


def ensure_dependencies(wheels: Path | None, site: Path) -> list[str]:
    """Every runtime dependency importable, installing carried wheels for the missing ones.

    Returns the wheels installed; raises CheckError naming what to carry otherwise."""
    missing = deps.absent_here(deps.runtime_requirements())
    if not missing:
        return []
    found = deps.wheels_for(wheels, missing) if wheels and wheels.is_dir() else {}
    if found:
        try:
            deps.install_wheels(list(found.values()), site)
        except deps.DepsError as err:
            raise CheckError(str(err)) from None
        sys.path.insert(0, str(site))
        importlib.invalidate_caches()
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p
        )
        missing = deps.absent_here(missing)
    if missing:
        names = ", ".join(deps.requirement_name(r) for r in missing)
        where = str(wheels) if wheels else "--wheels"
        raise CheckError(
            f"missing Python package(s) {names} ({'; '.join(missing)}) and no wheel for them in "
            f"{where}: run benchmarks/gpu_wheels.sh where pip works and name .whl in the run's "
            f"carry (docs/training.md, 'The device check')"
        )
    return [w.name for w in found.values()]


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
        note = f"{p.seconds:.1f} s of a {p.limit_s:.0f} s limit" if p.limit_s else ""
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


def signal_name(code: int) -> str:
    try:
        return signal.Signals(code).name
    except ValueError:
        return f"signal {code}"


def tail(log: Path) -> str:
    try:
        return log.read_text(errors="replace")[-LOG_TAIL:]
    except OSError:
        return ""


def last_line(log: Path) -> str:
    try:
        lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    return f"; last output: {lines[-1].strip()[:200]}" if lines else ""


def run_part(state: State, key: str, limit: float, work: Path, args: argparse.Namespace,
             fault: str | None) -> None:  # fmt: skip
    """One part in a process group of its own; SIGKILL to the group past ``limit`` seconds."""
    p = state.parts[key]
    result, log = work / f"part_{key}.json", work / f"part_{key}.log"
    cmd = [sys.executable, str(PARTS_SCRIPT), "--part", key, "--result", str(result),
           "--work", str(work), "--bandwidth", str(args.bandwidth_gbs * 1e9),
           "--peak-flops", str(args.peak_tflops * 1e12)]  # fmt: skip
    cmd += ["--dry"] if state.dry else []
    cmd += ["--fault", fault] if fault else []
    group = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
    start = time.monotonic()
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, **group)
    p.status, p.limit_s, p.pid = "running", limit, proc.pid
    write_outputs(state)
    try:
        proc.wait(timeout=limit)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
    reaped = kill_group(proc)
    p.seconds = time.monotonic() - start
    state.logs[key] = tail(log)
    try:
        got = json.loads(result.read_text())
    except (OSError, ValueError):
        got = {}
    p.rows = got.get("rows", [])
    state.env = state.env or got.get("env", {})
    if timed_out:
        p.status, p.why = (
            "timeout",
            f"killed (SIGKILL to its process group) at its {limit:.0f} s limit",
        )
    elif got.get("status") == "ok" and proc.returncode == 0:
        p.status = "ok"
    elif got.get("status") == "error":
        p.status, p.why = "error", got.get("why", "")
    elif not reaped:
        p.status, p.why = "died", f"still running {REAP_S:.0f} s after SIGKILL; left behind"
    elif proc.returncode < 0:
        p.status = "died"
        p.why = f"killed by {signal_name(-proc.returncode)}{last_line(log)}"
    else:
        p.status = "died"
        p.why = f"exit code {proc.returncode}{last_line(log)}"
    if p.status != "ok" and p.rows:
        p.why += f" ({len(p.rows)} row(s) measured before)"


def kill_group(proc: subprocess.Popen) -> bool:
    """SIGKILL the part's whole process group (it and any children), then reap it; False if
    it did not end within REAP_S seconds (a process stuck in the GPU driver, say)."""
    kill_quietly(proc.pid)
    try:
        proc.wait(timeout=REAP_S)
    except subprocess.TimeoutExpired:  # stuck in the driver: go on without it
        return False
    return True


def run_check(args: argparse.Namespace) -> int:
    mode = "dry" if args.cpu_dry_run else "gpu"
    faults = parse_pairs(args.inject_fault, "--inject-fault", FAULTS)
    limits = {k: float(v) for k, v in LIMITS[mode].items()}
    try:
        limits.update({k: float(v) for k, v in parse_pairs(args.limits, "--limits", None).items()})
    except ValueError:
        raise CheckError(f"bad --limits {args.limits}: seconds must be numbers") from None
    if any(v <= 0 for v in limits.values()) or args.budget_s <= 0:
        raise CheckError("limits and --budget-s must be positive seconds")
    keys = [k for k in ORDER if k in (args.parts or ORDER)]
    if not keys or any(k not in TITLES for k in args.parts or ""):
        raise CheckError(f"bad --parts {args.parts!r}: letters from abcd")
    args.bandwidth_gbs = args.bandwidth_gbs or (DRY_GBS if args.cpu_dry_run else H200_GBS)
    args.peak_tflops = args.peak_tflops or (DRY_TFLOPS if args.cpu_dry_run else H200_TFLOPS)
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    state = State(args.cpu_dry_run, args.budget_s, out, {k: PartState(k) for k in keys})
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        work = Path(tmp)
        state.wheels = ensure_dependencies(args.wheels, work / "site")
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (os.environ.get("PYTHONPATH", ""), str(ROOT / "src")) if p
        )
        if not args.cpu_dry_run and not cuda_present():
            raise CheckError("no CUDA device here (use --cpu-dry-run on a CPU)")
        current: list[str] = []

        def stop(signum: int, frame: Any) -> None:  # the caller's timeout: keep what is done
            for key in current:
                p = state.parts[key]
                if p.pid:
                    kill_quietly(p.pid)
                p.status, p.why = "interrupted", f"gpu_check got {signal_name(signum)}"
            write_outputs(state)
            sys.exit(128 + signum)

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        write_outputs(state)
        for key in keys:
            left = args.budget_s - state.elapsed()
            p = state.parts[key]
            if left < MINIMUM[mode]:
                p.status = "skipped"
                p.why = (f"{max(left, 0):.0f} s left of the {args.budget_s:.0f} s budget; "
                         f"a part needs at least {MINIMUM[mode]:.0f} s")  # fmt: skip
                write_outputs(state)
                continue
            current[:] = [key]
            run_part(state, key, min(limits[key], left), work, args, faults.get(key))
            current.clear()
            write_outputs(state)
            print(f"gpu_check: part {key} {state.parts[key].status} "
                  f"in {state.parts[key].seconds:.1f} s", file=sys.stderr, flush=True)  # fmt: skip
        state.finished = True
        write_outputs(state)
    print(table(state), end="")
    return 0


def kill_quietly(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def cuda_present() -> bool:
    """Whether torch sees a CUDA device, asked in a child process (this one stays torch-free)."""
    code = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)"
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-dry-run", action="store_true", help="tiny models on the CPU")
    parser.add_argument("--budget-s", type=float, default=450.0, help="all parts together")
    parser.add_argument("--parts", default=None, help="run only these parts (letters of abcd)")
    parser.add_argument(
        "--limits", action="append", default=[],
        help="seconds per part, e.g. a=120,d=60 (default: a 200, b 90, c 60, d 90; dry run 60)",
    )  # fmt: skip
    parser.add_argument(
        "--wheels", type=Path, default=ROOT / ".whl",
        help="folder of carried wheels for missing dependencies (default .whl)",
    )  # fmt: skip
    parser.add_argument(
        "--bandwidth-gbs", type=float, default=None,
        help="memory bandwidth for the decode bound, GB/s (default: H200 4800; dry run 20)",
    )  # fmt: skip
    parser.add_argument(
        "--peak-tflops", type=float, default=None,
        help="peak FLOP/s for MFU, TFLOP/s (default: H200 dense bf16 989; dry run 1)",
    )  # fmt: skip
    # tests only: PART:raise|hang|abort|orphan, optionally @1 (after the part's first rows)
    parser.add_argument("--inject-fault", action="append", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        return run_check(args)
    except (CheckError, deps.DepsError) as err:
        print(f"gpu_check: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
