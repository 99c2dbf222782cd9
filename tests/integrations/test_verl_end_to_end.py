"""verl's trainer, one update end to end on the CPU, launched by verl's own entry point
(``verl.trainer.main_ppo.main`` with a command line of overrides: ``validate_config``,
``run_ppo``'s ``ray.init`` from ``ray_kwargs``, ``TaskRunnerV1``): Ray (local, 2 logical
GPUs), TransferQueue, the FSDP2 actor on two gloo ranks (platform ``cpu``) and its
reference, two ``mcgpo_cpu`` replicas serving a warm-started tiny model, the ``mcgpo_env``
agent loop on the plugin environment ``e2e_fork`` (``e2e_fork_env.py``), the ``mcgpo``
trainer's credit step, pair layout and advantage step (with verl's rollout correction mapped
onto mcgpo's), the ``set_loss_fn`` loss with the pair and KL terms, the checkpoint and the
weight sync back to the replicas. 8 prompts x 8
samples x at most 2 turns (verl_cpu_run.py), in a fresh process."""

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

from verl_cpu_run import KL_COEF, MAX_TURNS, MINI_BATCH, PROMPTS, N  # noqa: E402

pytestmark = [pytest.mark.verl, pytest.mark.slow]
HERE = Path(__file__).resolve().parent
# The run takes ~2.5 min on the 2-core machine (148-161 s, 6-7 s of it the warm start; the
# training step itself ~17-20 s, the rest Ray, TransferQueue and the workers' start). A run
# that stalls (Ray's workers starved; see worker_niceness in verl_cpu_run.py) fails here with
# its last output, before a CI job's own limit.
DRIVER_TIMEOUT_S = 720


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
    env = dict(os.environ, VERL_PLATFORM="cpu", HYDRA_FULL_ERROR="1")
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


def test_one_update_through_main_ppo_on_two_ranks(run):
    result, metrics = run
    assert metrics["training/global_step"] == 1
    # every environment turn is one request to a mcgpo_cpu replica (two: one per rank,
    # tensor parallel 1) and, in training, one batch row: 8 prompts x 8 sessions x 1..2
    # turns, no errors; the credit step saw all of them. The validation's turns (8 episodes
    # after the update) are requests too.
    servers = result["servers"]
    assert sorted(servers) == ["mcgpo_cpu_server_0", "mcgpo_cpu_server_1"]
    validation = round(metrics["eval/turns"] * metrics["eval/episodes"])
    requests = sum(s["requests"] for s in servers.values()) - validation
    assert all(s["requests"] > 0 for s in servers.values())
    assert PROMPTS * N <= requests <= PROMPTS * N * MAX_TURNS
    assert metrics["mcgpo/pairs/rows_eligible"] == requests
    assert metrics["mcgpo/errored_rows"] == 0
    assert metrics["mcgpo/env_errors"] == metrics["mcgpo/env_crashes"] == 0
    # verl pads the batch to a multiple of lcm(dp, ppo_mini_batch_size * n) = lcm(2, 32) =
    # 32 rows; so there are (requests + padding) / 32 >= 64 / 32 = 2 mini-batches
    rows_per_mini = MINI_BATCH * N
    assert metrics["mcgpo/padding_rows"] == -requests % rows_per_mini
    assert (requests + metrics["mcgpo/padding_rows"]) // rows_per_mini >= 2
    # the warm start is what earns reward: the untrained model never wins, the cloned one
    # picks each path about half the time and wins about 3/4 of its episodes
    assert result["sft"]["before"]["eval/success"] == 0.0
    assert result["sft"]["after"]["eval/success"] > 0.0


def test_validation_logs_mcgpos_eval_metrics(run):
    """verl's validation after the update logs mcgpo's eval/* (the names of mcgpo's own
    evaluation) beside its own val-core reward: one episode per task of the validation
    parquet (8), none errored; the e2e_fork environment pays 10 on a win and scores 1, so
    success, score and verl's mean reward / 10 are the same number here."""
    _, metrics = run
    assert metrics["eval/episodes"] == PROMPTS and metrics["eval/errored"] == 0
    success = metrics["eval/success"]
    assert 0.0 <= success <= 1.0 and metrics["eval/score"] == pytest.approx(success)
    assert metrics["val-core/e2e_fork/reward/mean@1"] == pytest.approx(10 * success)
    assert metrics["eval/success/e2e_fork"] == pytest.approx(success)  # its task type
    assert 1.0 <= metrics["eval/turns"] <= MAX_TURNS
    assert 0.0 <= metrics["eval/valid_actions"] <= 1.0
    # the training batch's trajectories, none errored
    assert metrics["mcgpo/trajectories"] == PROMPTS * N
    assert metrics["mcgpo/errored_trajectories"] == 0


def test_the_update_has_a_gradient_a_kl_term_and_whole_pairs(run):
    _, metrics = run
    # wins and losses in a group: nonzero advantages of both signs, so a policy gradient
    assert metrics["critic/advantages/max"] > 0 > metrics["critic/advantages/min"]
    assert metrics["actor/grad_norm"] > 0 and metrics["actor/pg_loss"] != 0
    # the reference worker's log-probs and the KL loss: 0 in the first mini-batch (actor =
    # reference), > 0 after the first optimizer step, so its mean over >= 2 mini-batches too
    assert "timing_s/ref" in metrics
    assert metrics["actor/kl_loss"] > 0 and metrics["actor/kl_coef"] == pytest.approx(KL_COEF)
    # MCGPO's preference pairs from the trainer's credit step (in _balance_batch), laid out
    # so that no pair spans the two data-parallel ranks, and seen whole by the loss
    assert metrics["mcgpo/pairs"] > 0
    assert metrics["mcgpo/pairs_split_dp"] == 0 and metrics["mcgpo/layout_split_after"] == 0
    assert metrics["mcgpo/layout_pairs"] == metrics["mcgpo/pairs"]
    assert metrics["actor/pairs"] > 0 and metrics["actor/pairs_split"] == 0
    assert metrics["actor/pair_loss"] > 0  # softplus terms of positive weight
    assert 0 <= metrics["actor/pair_accuracy"] <= 1


def test_the_rollout_correction_runs_on_the_samplers_log_probs(run):
    """verl's rollout_correction (token-level TIS, cap 2) through the trainer's advantage
    step: mcgpo's rollout_correction_weights on the agent loop's rollout_log_probs. The
    actor computes pi_old in bf16 (verl's FSDP default mixed precision) and mcgpo_cpu
    samples in fp32 from the same weights, so the ratios are 1 up to bf16 rounding (a
    ratio mean of 1.0011 observed): the sampler-trainer mismatch the correction is for, far
    from the cap, so the weights are the ratios (weight mean = ratio mean)."""
    _, metrics = run
    mean, top = metrics["rollout_correction/ratio_mean"], metrics["rollout_correction/ratio_max"]
    assert abs(mean - 1.0) < 0.05 and top >= mean
    assert metrics["rollout_correction/clipped_frac"] == 0.0 and top <= 2.0
    assert metrics["rollout_correction/weight_mean"] == pytest.approx(mean, rel=1e-6)
    assert metrics["rollout_correction/seq_log_ratio_sd"] > 0  # bf16 vs fp32: not identical


def test_the_replicas_serve_the_trained_weights_after_the_sync(run):
    result, _ = run
    trained = result["trained_checksum"]  # of the actor's Hugging Face checkpoint of step 1
    assert trained is not None and trained != result["initial_checksum"]
    for state in result["servers"].values():
        # loaded twice: the initial sync of trainer.init() and on_step_end's after step 1
        assert state["global_steps"] == 1 and state["weight_loads"] == 2
        # the same float32 tensors summed in the same order: equal, not close
        assert state["checksum"] == trained
