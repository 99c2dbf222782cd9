"""``mcgpo train | sft | eval`` check the environment's name and options before any model
work (:func:`mcgpo.training.preflight.check_environment` builds one, as ``mcgpo bench``
checks its runs): a mistyped option is the environment's own one line with the closest
option, options the environment takes pass (command-line strings typed as TOML reads them),
and a served environment's free-form options go to its server as they did."""

from __future__ import annotations

import pytest

from mcgpo.training.config import ConfigError
from mcgpo.training.overrides import resolve_command
from mcgpo.training.preflight import check_environment


@pytest.mark.parametrize("command", ["train", "sft", "eval"])
def test_a_mistyped_environment_option_is_one_line_with_the_closest_option(command):
    cfg = resolve_command(command, ["--env.max_turn", "5"])
    with pytest.raises(ConfigError) as err:
        check_environment(cfg)
    assert str(err.value) == (
        "env 'household': unknown household option 'max_turn' (did you mean 'max_turns'?); "
        "known: max_turns, n_receptacles, n_distractors, task_types, expert"
    )


def test_an_option_of_another_environment_is_refused_and_a_right_one_passes():
    # n_receptacles is household's; webshop has no option of that name nor one close to it
    webshop = resolve_command("train", ["--env.name", "webshop", "--env.n_receptacles", "20"])
    with pytest.raises(ConfigError, match=r"^env 'webshop': unknown webshop option 'n_recep"):
        check_environment(webshop)
    # the string "20" is typed (20) as the run types it: the range check would refuse text
    check_environment(resolve_command("train", ["--env.n_receptacles", "20"]))
    bad_value = resolve_command("train", ["--env.n_receptacles", "9"])
    with pytest.raises(ConfigError, match=r"^env 'household': n_receptacles must be in \[12"):
        check_environment(bad_value)


def test_an_unknown_environment_keeps_its_did_you_mean():
    with pytest.raises(ConfigError, match=r"^env 'hosehold': unknown environment 'hosehold' "):
        check_environment(resolve_command("train", ["--env.name", "hosehold"]))


@pytest.mark.serve
def test_a_served_environment_takes_the_options_its_server_serves():
    pytest.importorskip("uvicorn")
    pytest.importorskip("httpx")
    from mcgpo.envs.serving.launch import ServedEnv
    from mcgpo.envs.workers import EnvSpec

    options = {"n_receptacles": 20}  # the client's options are free-form: the server's own
    with ServedEnv(EnvSpec("household", options), "household", options, max_sessions=2) as url:
        flags = ["--env.name", "remote", "--env.url", url, "--env.remote_name", "household"]
        check_environment(resolve_command("train", [*flags, "--env.n_receptacles", "20"]))
        other = resolve_command("train", [*flags, "--env.n_receptacles", "30"])
        with pytest.raises(ConfigError, match="option 'n_receptacles' is 30 here but 20 on"):
            check_environment(other)  # as the run's own check, now before any model work
    unreachable = ["--env.url", "http://127.0.0.1:9", "--env.retries", "0"]
    cfg = resolve_command("train", [*flags[:2], *unreachable, *flags[4:]])
    with pytest.raises(ConfigError, match=r"^env 'remote': remote env: http://127.0.0.1:9"):
        check_environment(cfg)


def test_the_environment_built_to_check_the_options_is_closed(monkeypatch):
    """The probe environment (a JVM for TextWorld-Express, a session for a served one) is
    closed at once; the factory still builds fresh, open environments for the run."""
    from mcgpo.envs import ENVIRONMENTS
    from mcgpo.envs.household import HouseholdEnv

    built: list[Closing] = []

    class Closing(HouseholdEnv):
        def __init__(self, **options: object) -> None:
            super().__init__(**options)
            self.closed = False
            built.append(self)

        def close(self) -> None:
            self.closed = True

    monkeypatch.setitem(ENVIRONMENTS, "closing", Closing)
    cfg = resolve_command("train", ["--env.name", "closing", "--out", "unused"])
    check_environment(cfg)
    assert [env.closed for env in built] == [True]


def test_sft_into_a_folder_with_a_policy_is_one_line_and_writes_nothing(tmp_path, capsys):
    from mcgpo.cli import main

    run = tmp_path / "run"  # a finished run (sft or train): its policy and its records
    (run / "model").mkdir(parents=True)
    (run / "model" / "config.json").write_text("{}")
    (run / "config.toml").write_text("# mcgpo train --out run\n")
    (run / "metrics.jsonl").write_text('{"update": 0}\n')
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert main(["sft", "--preset", "household-smoke", "--out", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"mcgpo sft: error: run folder {str(run)!r} already holds a run (its model/); "
        "mcgpo sft starts a fresh one: use another --out"
    )
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_sft_refuses_a_train_runs_checkpoint_and_takes_a_warm_start_that_stopped(tmp_path):
    from mcgpo.training.run_folder import check_sft_folder

    def cfg(folder):
        return resolve_command("sft", ["--preset", "household-smoke", "--out", str(folder)])

    trained = tmp_path / "trained"  # stopped after a checkpoint, before its model/
    (trained / "checkpoints" / "update-000001" / "model").mkdir(parents=True)
    (trained / "checkpoints" / "update-000001" / "trainer.pt").write_bytes(b"x")
    (trained / "checkpoints" / "latest").write_text("update-000001")
    with pytest.raises(ConfigError, match=r"already holds a run \(its checkpoints/\)"):
        check_sft_folder(cfg(trained))
    stopped = tmp_path / "stopped"  # an sft that stopped before saving: bench starts it again
    stopped.mkdir()
    (stopped / "metrics.jsonl").write_text('{"update": 0}\n')
    check_sft_folder(cfg(stopped))
    check_sft_folder(cfg(tmp_path / "new"))
