"""Device check of the GPU path (issues 16, 26, 33): one table in under 8 minutes on one H200.

    PYTHONPATH=src python3 benchmarks/gpu/gpu_check.py [--cpu-dry-run] [--budget-s 450]

Builds Qwen2.5-1.5B-shaped models from the config (Qwen2ForCausalLM: hidden 1536, 28 layers,
12 heads, 2 key/value heads, MLP 8960, vocabulary 151936, rope theta 1e6, tied embeddings)
with random weights and a tokenizer trained offline on household text (nothing is
downloaded), and measures (gpu_check_parts.py runs one part; the parts live in
gpu_check_sampling.py, gpu_check_update.py and gpu_check_train.py):

a. sampling at 128 household prompts x 128 new tokens: ``model.generate`` (whole call), the
   dynamic KV-cache sampler and the static sampler (compiled decode step) with their decode
   steps timed apart from their prefill, against the memory-bandwidth bound of decoding; the
   static sampler once with transformers' sdpa decode attention and once with mcgpo's
   GQA-native one (``decode_attention``), same prompts and seed, their tokens compared;
b. the update: ``update_policy`` and the raw forward+backward over the same tokens (body on
   every token, LM head on the response tokens, as the update runs it), tokens/s and MFU
   from the same FLOP count, and the update's peak memory beside the memory plan's;
c. pi_old under bf16: |delta log p| between the sampler and the training forward, and the
   spread of d at theta = theta_old;
d. ``mcgpo train``, one update on household (household-smoke preset) with a model of the
   1.5B's layers cut to fit 2 GB of files: with the defaults a GPU user gets, then with the
   speed switches off (``train.compile false``, ``rollout.decode_attention sdpa``);
e. the update of part b with eager and then with compiled decoder layers (``train.compile``),
   on the same model and rows, in bf16-mixed and in pure bf16.

A switch that this checkout lacks makes its rows say ``missing`` (the part goes on).

Every part runs in a process of its own (its own process group). Its start-up (interpreter,
imports, CUDA context) ends with its first write of its result file; from then on a hard
wall-clock limit counts, past which the group is killed with SIGKILL (a start-up that hangs
is killed too, after ``STARTUP_S``); a part that has written ``ok`` or ``error`` is
reported so however long it then takes to exit. A part's rows are written to
``$OUT/gpu_check.md`` and ``$OUT/gpu_check.json`` (atomically) as soon as the part ends, and
a killed or crashed part keeps the rows it measured before; the end of each part's output
goes to ``$OUT/gpu_check.log``. The whole check has a budget (``--budget-s``, 450 s by
default, 1800 s in the dry run; start-ups, imports and compiles included); a part that
cannot get its minimum time within what is left is skipped, and its rows say so. Before
anything, every runtime dependency of pyproject.toml must be importable, from the
environment or from wheels carried in ``--wheels`` (default ``.whl``, made by
benchmarks/gpu/gpu_wheels.sh; installed with pip --no-index into a temporary folder); a
missing one ends the check with one line, exit 2.
``--cpu-dry-run`` runs the same machinery with tiny models on the CPU (minutes;
tests/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import contextlib
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
from gpu_check_report import (
    LOG_TAIL,
    ORDER,
    TITLES,
    PartState,
    State,
    table,
    write_outputs,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PARTS_SCRIPT = HERE / "gpu_check_parts.py"
# seconds per part, counted from the end of its start-up (limit), GPU and dry run: within
# the 450 s default budget the expected total is about 300 s (docs/reference/gpu.md)
LIMITS = {"gpu": {"a": 240, "b": 90, "c": 60, "d": 120, "e": 150},
          "dry": {"a": 300, "b": 300, "c": 300, "d": 300, "e": 600}}  # fmt: skip
# seconds a part may take to start up (interpreter, torch, transformers, CUDA context)
# before its first result write; apart from its limit, within what is left of the budget
STARTUP_S = {"gpu": 120.0, "dry": 300.0}
BUDGET_S = {"gpu": 450.0, "dry": 1800.0}  # --budget-s by default
MINIMUM = {"gpu": 30.0, "dry": 3.0}
FAULTS = ("raise", "hang", "abort", "orphan")
REAP_S = 30.0  # seconds to wait for a part to exit: after SIGKILL, or after its final write
POLL_S = 0.2  # seconds between two looks at a running part's result file
H200_GBS, H200_TFLOPS = 4800.0, 989.0  # throughput.py's datasheet figures
DRY_GBS, DRY_TFLOPS = 20.0, 1.0


class CheckError(ValueError):
    """Bad arguments or a missing dependency: one line, exit 2."""


def parse_pairs(values: list[str], what: str, kinds: tuple[str, ...] | None) -> dict[str, str]:
    """``part:value`` or ``part=value`` items (comma lists allowed) -> {part: value}."""
    out = {}
    for item in ",".join(values).split(","):
        if not item:
            continue
        key, sep, value = item.replace("=", ":", 1).partition(":")
        if not sep or key not in TITLES or not value:
            raise CheckError(f"bad {what} {item!r}: expected PART:VALUE with PART in a, b, c, d, e")
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
            f"{where}: run benchmarks/gpu/gpu_wheels.sh where pip works and name .whl in the run's "
            f"carry (docs/reference/gpu.md, 'The device check')"
        )
    return [w.name for w in found.values()]


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


def result_status(path: Path) -> str:
    """The status in a part's result file ("" before its first write)."""
    try:
        return str(json.loads(path.read_text()).get("status", ""))
    except (OSError, ValueError, AttributeError):
        return ""


def watch_part(state: State, p: PartState, proc: subprocess.Popen, result: Path,
               limit: float) -> str:  # fmt: skip
    """Wait for a part: ``exited``, or why it must be killed: ``startup`` (no first result
    write within the start-up allowance), ``timeout`` (its limit, counted from that first
    write), or ``lingered`` (a final status written, then no exit within REAP_S seconds).

    Only a part that runs past its limit depends on it: a slow start-up (a loaded machine
    importing torch) does not eat the limit, and a part that wrote ok or error is reported
    so however long it then takes to exit."""
    mode = "dry" if state.dry else "gpu"
    start, ready, final = time.monotonic(), None, None
    allowance = min(STARTUP_S[mode], max(state.budget_s - state.elapsed(), 0.0))

    def started(now: float) -> float:  # the first result write: the limit counts from here
        p.startup_s = now - start
        p.limit_s = min(limit, max(state.budget_s - state.elapsed(), 0.0))
        write_outputs(state)
        return now

    while proc.poll() is None:
        now, status = time.monotonic(), result_status(result)
        if ready is None and status:
            ready = started(now)
        if status in ("ok", "error"):
            final = final or now
            if now - final > REAP_S:
                return "lingered"
        elif ready is None and now - start > allowance:
            p.startup_s = now - start
            return "startup"
        elif ready is not None and now - ready > p.limit_s:
            return "timeout"
        time.sleep(POLL_S)
    if ready is None and result_status(result):  # wrote and exited between two looks
        started(time.monotonic())
    return "exited"


def run_part(state: State, key: str, limit: float, work: Path, args: argparse.Namespace,
             fault: str | None) -> None:  # fmt: skip
    """One part in a process group of its own; SIGKILL to the group past its limit."""
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
    ended = watch_part(state, p, proc, result, limit)
    reaped = kill_group(proc)
    p.seconds = time.monotonic() - start
    state.logs[key] = tail(log)
    try:
        got = json.loads(result.read_text())
    except (OSError, ValueError):
        got = {}
    p.rows = got.get("rows", [])
    state.env = state.env or got.get("env", {})
    status = got.get("status")
    if ended == "startup":
        p.status, p.why = (
            "timeout",
            (
                f"killed (SIGKILL to its process group): not started up (imports, device) "
                f"within {p.startup_s:.0f} s"
            ),
        )
    elif ended == "timeout":
        p.status, p.why = (
            "timeout",
            f"killed (SIGKILL to its process group) at its {p.limit_s:.0f} s limit",
        )
    elif status == "ok" and (proc.returncode == 0 or ended == "lingered"):
        p.status = "ok"
    elif status == "error":
        p.status, p.why = "error", got.get("why", "")
    elif not reaped:
        p.status, p.why = "died", f"still running {REAP_S:.0f} s after SIGKILL; left behind"
    elif proc.returncode < 0:
        p.status = "died"
        p.why = f"killed by {signal_name(-proc.returncode)}{last_line(log)}"
    else:
        p.status = "died"
        p.why = f"exit code {proc.returncode}{last_line(log)}"
    if ended == "lingered":
        p.why = "; ".join(x for x in (p.why, f"killed {REAP_S:.0f} s after its last write") if x)
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
    args.budget_s = BUDGET_S[mode] if args.budget_s is None else args.budget_s
    if any(v <= 0 for v in limits.values()) or args.budget_s <= 0:
        raise CheckError("limits and --budget-s must be positive seconds")
    keys = [k for k in ORDER if k in (args.parts or ORDER)]
    if not keys or any(k not in TITLES for k in args.parts or ""):
        raise CheckError(f"bad --parts {args.parts!r}: letters from abcde")
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
    parser.add_argument(
        "--budget-s", type=float, default=None,
        help="seconds for all parts together (default 450; dry run 1800, for a busy CPU)",
    )  # fmt: skip
    parser.add_argument("--parts", default=None, help="run only these parts (letters of abcde)")
    parser.add_argument(
        "--limits", action="append", default=[],
        help="seconds per part after its start-up, e.g. a=120,d=60 (default: a 240, b 90, c 60, "
        "d 120, e 150; dry run 300, e 600)",
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
