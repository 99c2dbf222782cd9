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
