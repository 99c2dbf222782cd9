"""Experiment tracking (``--report_to``): each tracker records the run a test reads back.

W&B in offline mode (its transaction log read back record by record), MLflow on a local
SQLite store (read back with MLflow's client), trackio on a local folder (read back with its
storage): the same metric names and values as ``metrics.jsonl``, the run config, and a
resumed run continuing the same tracked run. Then the bad inputs: an unknown tracker, ``none``
with a tracker, a missing package, MLflow's filesystem store.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest

from mcgpo.cli import main, resolve
from mcgpo.training.config import ConfigError, RunConfig
from mcgpo.training.metrics import read_metrics
from mcgpo.training.run_folder import code_version
from mcgpo.training.tracking import check_trackers_installed

pytestmark = pytest.mark.slow  # a few smoke runs of two updates


def numeric_records(folder: Path) -> dict[int, dict[str, float]]:
    """metrics.jsonl as update -> the numbers the trackers get (training and eval merged)."""
    merged: dict[int, dict[str, float]] = {}
    for record in read_metrics(folder / "metrics.jsonl"):
        numbers = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "time"}
        merged.setdefault(record["update"], {}).update(numbers)
    return merged


def assert_same_numbers(got: dict[int, dict], want: dict[int, dict]) -> None:
    assert sorted(got) == sorted(want)
    for update in want:
        assert got[update].keys() == want[update].keys(), update
        assert got[update] == pytest.approx(want[update]), update


# ---------------------------------------------------------------- config and bad input
def test_report_to_parses_like_the_trainer_s_list():
    assert RunConfig().trackers() == ("tensorboard",)  # the default
    assert RunConfig(report_to="none").trackers() == ()
    assert RunConfig(report_to=" wandb, mlflow ,wandb").trackers() == ("wandb", "mlflow")
    # --tensorboard false (the older switch) drops TensorBoard from the list
    assert RunConfig(report_to="tensorboard,trackio", tensorboard=False).trackers() == ("trackio",)
    assert resolve("train", ["--report_to", "mlflow"]).report_to == "mlflow"
    assert resolve("train", ["--report-to", "mlflow"]).report_to == "mlflow"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("wandbb", "report_to: unknown tracker 'wandbb' (did you mean wandb?); choose from"),
        ("none,wandb", "report_to: none cannot be combined with trackers (none,wandb)"),
        (" , ", "report_to is empty; name a tracker or none"),
    ],
)
def test_a_bad_report_to_is_one_line_exit_2(tmp_path, capsys, value, message):
    assert main(["train", "--out", str(tmp_path / "run"), "--report_to", value]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mcgpo train: error: " + message) and err.count("\n") == 1
    with pytest.raises(ConfigError, match="report_to"):
        RunConfig(report_to=value).check()
    assert not (tmp_path / "run").exists()


def test_a_missing_tracker_package_names_the_extra(monkeypatch, smoke_args, tmp_path, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    with pytest.raises(
        ConfigError, match=r"needs the wandb package: pip install 'mcgpo\[tracking\]'"
    ):
        check_trackers_installed(["tensorboard", "wandb"])
    assert main(smoke_args(tmp_path / "run", "--report_to", "tensorboard,wandb")) == 2
    err = capsys.readouterr().err
    assert err == (
        "mcgpo train: error: --report_to wandb needs the wandb package: "
        "pip install 'mcgpo[tracking]'\n"
    )
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # refused before any run


def test_mlflow_s_filesystem_store_is_refused_before_the_run(
    monkeypatch, smoke_args, tmp_path, capsys
):
    pytest.importorskip("mlflow", reason="the tracking extra")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    assert main(smoke_args(tmp_path / "run", "--report_to", "mlflow")) == 2
    err = capsys.readouterr().err
    assert "cannot hold metrics named eval/success and eval/success/<task type>" in err
    assert err.count("\n") == 1 and not (tmp_path / "run" / "metrics.jsonl").exists()


def test_tensorboard_is_the_default_also_in_the_smoke_preset(smoke_args, tmp_path):
    out = tmp_path / "run"
    assert main(smoke_args(out, "--train.updates", "1")) == 0
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert not (out / "tracking.json").exists()  # TensorBoard has no run id to keep


# ---------------------------------------------------------------- W&B (offline)
def wandb_records(run_dir: Path) -> list[tuple[str, object]]:
    """The records of an offline W&B run (``run-<id>.wandb``), once its ``exit`` record (the
    last one written) is there: W&B's service may still be writing the log when
    ``finish()`` returns on a busy machine, so this waits for it (generously)."""
    (path,) = run_dir.glob("run-*.wandb")
    deadline = time.monotonic() + 120
    records = parse_wandb_log(path.read_bytes())
    while not any(kind == "exit" for kind, _ in records) and time.monotonic() < deadline:
        time.sleep(0.5)
        records = parse_wandb_log(path.read_bytes())
    return records


def parse_wandb_log(raw: bytes) -> list[tuple[str, object]]:
    """W&B's transaction log is LevelDB's log format (32 KiB blocks; each chunk a 7-byte
    header: CRC, length, type 1 = whole, 2/3/4 = first/middle/last) after a 7-byte file
    header; each record a protobuf ``Record``. The SDK no longer ships a Python reader."""
    from wandb.proto import wandb_internal_pb2

    assert raw[:4] == b":W&B"
    block, pos, parts, records = 32768, 7, [], []
    while pos + 7 <= len(raw):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        if length == 0 and kind == 0:  # zero padding
            pos += left
            continue
        if pos + 7 + length > len(raw):  # a chunk still being written
            break
        parts.append(raw[pos + 7 : pos + 7 + length])
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(parts))
            parts = []
            which = record.WhichOneof("record_type")
            if which is not None:
                records.append((which, getattr(record, which)))
    return records


def wandb_history(run_dir: Path) -> dict[int, dict[str, float]]:
    rows: dict[int, dict[str, float]] = {}
    for kind, body in wandb_records(run_dir):
        if kind == "history":
            # newer SDKs put every key in nested_key (one part: the name with its slashes)
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in body.item}
            logged = {k: v for k, v in items.items() if not k.startswith("_") and k != "time"}
            rows.setdefault(int(logged["update"]), {}).update(logged)
    return rows


def test_wandb_offline_records_the_metrics_config_and_resumes_the_same_run(
    monkeypatch, smoke_args, tmp_path
):
    pytest.importorskip("wandb", reason="the tracking extra")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    out = tmp_path / "run"
    assert main(smoke_args(out, "--report_to", "wandb", "--deterministic")) == 0
    run_id = json.loads((out / "tracking.json").read_text())["wandb"]["id"]
    (first,) = (out / "wandb").glob(f"offline-run-*-{run_id}")
    runs = [body for kind, body in wandb_records(first) if kind == "run"]
    assert runs[0].run_id == run_id and runs[0].project == "mcgpo"
    assert runs[0].display_name == "run"  # named after the run folder
    config = {i.key: json.loads(i.value_json) for i in runs[0].config.update}
    assert config["train"]["updates"] == 2 and config["algo"]["name"] == "mcgpo"
    assert config["rollout"]["groups"] == 2
    assert config["code"]["version"] == code_version()["version"]  # the code the run ran
    # every number of metrics.jsonl under its own name at its update (eval/* at update 0 too)
    expected = numeric_records(out)
    assert sorted(expected) == [0, 1, 2]
    assert_same_numbers(wandb_history(first), expected)
    assert "rollout/success_rate" in expected[1] and "eval/success" in expected[0]

    # resumed: the same W&B run id, the new update logged to it
    assert (
        main(
            smoke_args(
                out, "--report_to", "wandb", "--deterministic", "--train.updates", "3", "--resume"
            )
        )
        == 0
    )
    assert json.loads((out / "tracking.json").read_text())["wandb"]["id"] == run_id
    second = [d for d in (out / "wandb").glob(f"offline-run-*-{run_id}") if d != first]
    assert len(second) == 1  # W&B writes each offline session beside the last
    runs = [body for kind, body in wandb_records(second[0]) if kind == "run"]
    assert runs[0].run_id == run_id
    history = wandb_history(second[0])
    assert sorted(history) == [3]
    assert history[3] == pytest.approx(numeric_records(out)[3])


# ---------------------------------------------------------------- MLflow (local store)
def test_mlflow_records_metrics_and_params_and_resumes_the_same_run(
    monkeypatch, smoke_args, tmp_path
):
    pytest.importorskip("mlflow", reason="the tracking extra")
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "smoke")
    out = tmp_path / "run"
    assert main(smoke_args(out, "--report_to", "tensorboard,mlflow")) == 0
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))  # both trackers fed
    saved = json.loads((out / "tracking.json").read_text())["mlflow"]
    assert saved["tracking_uri"] == uri
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(saved["run_id"])
    assert run.info.run_name == "run" and run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "smoke"
    params = run.data.params
    assert params["train.updates"] == "2" and params["algo.name"] == "mcgpo"
    assert params["rollout.group_size"] == "4" and params["train.lr"] == "0.001"
    assert params["code.version"] == code_version()["version"]  # the code the run ran

    def history(key):
        return {m.step: m.value for m in client.get_metric_history(saved["run_id"], key)}

    expected = numeric_records(out)
    for key in ("rollout/success_rate", "loss/policy", "eval/success", "adv/std"):
        want = {u: rec[key] for u, rec in expected.items() if key in rec}
        assert want and history(key) == pytest.approx(want), key
    names = {k for rec in expected.values() for k in rec} - {"update"} | {"time"}
    assert set(run.data.metrics) == names  # every metrics.jsonl name, "time" included

    # resumed with one more update: the same MLflow run goes on; train.updates keeps the value
    # it started with (MLflow's params are set once)
    assert (
        main(
            smoke_args(out, "--report_to", "tensorboard,mlflow", "--train.updates", "3", "--resume")
        )
        == 0
    )
    assert json.loads((out / "tracking.json").read_text())["mlflow"]["run_id"] == saved["run_id"]
    assert sorted(history("loss/policy")) == [1, 2, 3]
    assert history("loss/policy")[3] == pytest.approx(numeric_records(out)[3]["loss/policy"])
    assert len(client.search_runs([run.info.experiment_id])) == 1


# ---------------------------------------------------------------- trackio (local)
def test_trackio_records_the_run_and_resumes_it(monkeypatch, smoke_args, tmp_path):
    pytest.importorskip("trackio", reason="the tracking extra")
    import trackio.sqlite_storage
    import trackio.utils
    from trackio.sqlite_storage import SQLiteStorage

    # trackio reads TRACKIO_DIR once, when imported: its modules' copies are pointed here
    for module in (trackio.utils, trackio.sqlite_storage):
        monkeypatch.setattr(module, "TRACKIO_DIR", tmp_path / "trackio")
    monkeypatch.setenv("TRACKIO_PROJECT", "smoke")
    out = tmp_path / "run"
    assert main(smoke_args(out, "--report_to", "trackio")) == 0
    assert (tmp_path / "trackio" / "smoke.db").is_file()  # not the user's own trackio folder
    saved = json.loads((out / "tracking.json").read_text())["trackio"]
    assert saved["project"] == "smoke" and saved["name"].startswith("run-")
    config = SQLiteStorage.get_run_config("smoke", saved["name"])
    assert config["train"]["updates"] == 2 and config["algo"]["name"] == "mcgpo"
    assert main(smoke_args(out, "--report_to", "trackio", "--train.updates", "3", "--resume")) == 0
    assert json.loads((out / "tracking.json").read_text())["trackio"] == saved
    assert SQLiteStorage.get_runs("smoke") == [saved["name"]]  # the same trackio run went on
    logged: dict[int, dict[str, float]] = {}
    for row in SQLiteStorage.get_logs("smoke", saved["name"]):
        numbers = {
            k: v for k, v in row.items() if k not in ("timestamp", "step", "time") and k[0] != "_"
        }
        logged.setdefault(row["step"], {}).update(numbers)
    expected = {
        u: {k: v for k, v in r.items() if k != "update"} for u, r in numeric_records(out).items()
    }
    assert sorted(logged) == [0, 1, 2, 3]
    assert_same_numbers(logged, expected)
