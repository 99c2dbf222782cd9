"""verl's trainer, one update end to end on the CPU: Ray (local, logical GPU), TransferQueue,
the FSDP2 engine on gloo (platform ``cpu``), the ``mcgpo_cpu`` rollout replica serving the
tiny model, the ``mcgpo_env`` agent loop on ``household``, the ``mcgpo`` trainer's
advantage step and the ``set_loss_fn`` loss, and the weight sync back to the replica.
2 prompts x 2 samples x at most 2 turns (verl_cpu_run.py), in a fresh process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

verl = pytest.importorskip("verl")

pytestmark = [pytest.mark.verl, pytest.mark.slow]
HERE = Path(__file__).resolve().parent
# The run takes ~1.5-2.5 min on the 2-core machine, also with a benchmark on both cores. A
# run that stalls (Ray's workers starved; see verl_cpu_run.py's ray.init) fails here with
# its last output, well before a CI job's own limit.
DRIVER_TIMEOUT_S = 480


def tail(log: Path, chars: int = 6000) -> str:
    return log.read_text(errors="replace")[-chars:]


def stop(proc: subprocess.Popen) -> None:
    """End the driver's process group (the driver; Ray's raylet, GCS and workers share its
    fate): SIGTERM first (the driver's Ray shuts down on it), SIGKILL after 20 s."""
    for sig, grace in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=grace)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def run_driver(
    out: Path, env: dict[str, str], timeout: float = DRIVER_TIMEOUT_S,
    script: Path = HERE / "verl_cpu_run.py",
) -> None:  # fmt: skip
    """``SCRIPT OUT`` (the driver verl_cpu_run.py) in its own session, its output in
    OUT/driver.log (a file, not a pipe: a leftover Ray process holding a pipe cannot block
    the test); fails with the log's tail on a non-zero exit or after ``timeout`` seconds."""
    log = out / "driver.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, str(script), str(out)], env=env,
            stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop(proc)
            pytest.fail(f"{script.name} did not finish in {timeout:.0f} s; its last output "
                        f"({log}):\n{tail(log)}")  # fmt: skip
    if code != 0:
        pytest.fail(f"{script.name} exited with {code}; its last output ({log}):\n{tail(log)}")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[dict, dict]:
    """(result.json, the step's metrics) of one verl_cpu_run.py run."""
    out = tmp_path_factory.mktemp("verl_cpu_run")
    src = str(HERE.parents[1] / "src")
    env = dict(os.environ, VERL_PLATFORM="cpu", VERL_FILE_LOGGER_PATH=str(out / "metrics.jsonl"))
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONUNBUFFERED"] = "1"  # the log's tail is the latest output
    run_driver(out, env)
    result = json.loads((out / "result.json").read_text())
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 1  # one training step logged
    return result, lines[0]["data"]


STALLING_DRIVER = """import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[1] + "/child.pid", "w").write(str(child.pid))
print("verl_cpu_run: stalled here", flush=True)
time.sleep(600)
"""


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")  # a zombie has ended; its new parent reaps it


def test_a_stalled_driver_is_stopped_and_the_failure_shows_its_last_output(tmp_path):
    """The limit ends the driver's whole process group (here: the driver and a child, as
    Ray's processes are) and the failure names the limit and carries the last output."""
    script = tmp_path / "stalls.py"
    script.write_text(STALLING_DRIVER)
    with pytest.raises(pytest.fail.Exception) as failure:
        run_driver(tmp_path, dict(os.environ), timeout=5, script=script)
    message = str(failure.value)
    assert "did not finish in 5 s" in message and "verl_cpu_run: stalled here" in message
    child = int((tmp_path / "child.pid").read_text())
    for _ in range(50):
        if gone(child):
            break
        time.sleep(0.1)
    assert gone(child)


def test_a_failing_driver_fails_with_its_exit_code_and_last_output(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("import sys\nprint('verl_cpu_run: broke', flush=True)\nsys.exit(3)\n")
    with pytest.raises(pytest.fail.Exception, match=r"exited with 3(.|\n)*verl_cpu_run: broke"):
        run_driver(tmp_path, dict(os.environ), timeout=60, script=script)


def test_one_update_runs_through_verl_trainer(run):
    result, metrics = run
    assert result["global_steps"] == 2  # fit() ran step 1 and stopped (total_training_steps=1)
    assert metrics["training/global_step"] == 1
    # every environment turn is one request to the mcgpo_cpu replica and one batch row:
    # 2 prompts x 2 sessions x 1..2 turns; the advantage step saw all of them
    requests = result["server"]["requests"]
    assert 4 <= requests <= 8
    assert metrics["mcgpo/pairs/rows_eligible"] == requests
    assert metrics["mcgpo/errored_rows"] == 0
    for key in ("actor/pg_loss", "actor/pair_loss", "actor/pairs", "actor/pairs_split"):
        assert key in metrics


def test_update_steps_the_optimizer_and_syncs_the_weights_to_the_replica(run):
    result, metrics = run
    # The untrained tiny model earns no household reward in 2 turns, so every advantage is
    # 0 and (no KL, no entropy term) the gradient is exactly 0. AdamW then only decays:
    # p <- p * (1 - lr * weight_decay) per optimizer step, lr = 1e-2, weight_decay = 1e-2,
    # and there is one step per mini-batch of ppo_mini_batch_size * n = 2 * 2 = 4 rows
    # (verl pads the rows up to a multiple of 4). The replica's weights after on_step_end's
    # sync are the trained ones, version 1.
    assert metrics["actor/grad_norm"] == 0.0 and metrics["actor/pg_loss"] == 0.0
    steps = -(-result["server"]["requests"] // 4)
    expected = result["initial_checksum"] * (1 - 1e-2 * 1e-2) ** steps
    assert result["server"]["global_steps"] == 1
    assert result["server"]["checksum"] == pytest.approx(expected, rel=1e-6)
    assert result["server"]["checksum"] != pytest.approx(result["initial_checksum"], rel=1e-6)
