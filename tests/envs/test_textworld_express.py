"""TextWorld-Express env: pure context helpers and install errors (no extra needed), then the
real engine in a JVM (marked twx; skipped without the extra or Java)."""

from __future__ import annotations

import shutil
import sys
import types

import pytest

from mcgpo.envs import textworld_express as twx

LOOK = (
    "You are in the kitchen. In one part of the room you see a stove. There is also a fridge "
    "that is closed. \nTo the North you see a closed plain door. "
)
INVENTORY = "Inventory (maximum capacity is 5 items): \n  a cookbook\n  an egg 2\n"


# ---------------------------------------------------------------- pure helpers
def test_room_and_items_golden():
    assert twx.room_of(LOOK) == "kitchen"
    assert twx.room_of("") == ""  # simonsays has no look text
    assert twx.items_of(INVENTORY) == ["cookbook", "egg 2"]  # articles dropped, sorted
    assert twx.items_of("Inventory: \n  Your inventory is currently empty.\n") == []


def test_context_golden():
    infos = {"look": LOOK, "inventory": INVENTORY, "score": 0.375, "scoreRaw": 3.0}
    actions = ("look around", "move north", "open fridge", "put egg 2 in fridge", "take cookbook")
    c = twx.context_of("You take the egg.", infos, actions)
    # h(s): look text with white space collapsed + carried items.
    assert c.state == (
        "look=You are in the kitchen. In one part of the room you see a stove. There is also a "
        "fridge that is closed. To the North you see a closed plain door.;inventory=cookbook,egg 2"
    )
    assert c.state_coarse == "loc=kitchen;hold=cookbook,egg"  # room + items, digits removed
    assert c.progress == "score=3" and c.progress_value == 0.375
    # F: verbs that can score (look/move/open are not among them).
    assert c.enabled == "put,take"
    assert c.anchor == (
        "You take the egg.\nLocation: kitchen. Held: cookbook, egg 2.\nActions: look around | "
        "move north | open fridge | put egg 2 in fridge | take cookbook"
    )
    # A failed game reports score -1: progress_value is clipped to [0, 1].
    failed = twx.context_of("You eat the meal.", {**infos, "score": -1.0, "scoreRaw": -1.0}, ())
    assert failed.progress == "score=-1" and failed.progress_value == 0.0


def test_bad_options_are_one_line_errors():
    from mcgpo.envs import make_env

    with pytest.raises(twx.TextWorldExpressError, match="unknown TWX game 'zork'"):
        make_env("textworld-express", game="zork")
    with pytest.raises(twx.TextWorldExpressError, match="unknown textworld-express option 'fold'"):
        make_env("textworld-express", fold="dev")
    with pytest.raises(twx.TextWorldExpressError, match="max_turns must be a positive integer"):
        make_env("textworld-express", max_turns=-3)


def test_missing_extra_names_the_install_command(monkeypatch):
    from mcgpo.envs import make_env

    monkeypatch.setitem(sys.modules, "textworld_express", None)  # "import" now fails
    with pytest.raises(twx.TwxUnavailable) as err:
        make_env("textworld-express")
    assert "pip install 'mcgpo[twx]'" in str(err.value) and "\n" not in str(err.value)


def test_missing_java_names_the_fix(monkeypatch):
    from mcgpo.envs import make_env

    fake = types.ModuleType("textworld_express")
    fake.TextWorldExpressEnv = object  # the extra "is installed"; Java is not
    monkeypatch.setitem(sys.modules, "textworld_express", fake)
    monkeypatch.setattr(twx.shutil, "which", lambda name: None)
    twx._java_major.cache_clear()
    try:
        with pytest.raises(twx.TwxUnavailable) as err:
            make_env("textworld-express")
    finally:
        twx._java_major.cache_clear()
    message = str(err.value)
    assert "needs Java 11+ on PATH" in message and "install a JDK" in message


# ---------------------------------------------------------------- the real engine
def _twx_available() -> bool:
    try:
        import textworld_express  # noqa: F401
    except ImportError:
        return False
    return shutil.which("java") is not None


engine_test = pytest.mark.skipif(
    not _twx_available(),
    reason="needs the twx extra and Java 11+: pip install 'mcgpo[twx]' and a JDK",
)


@pytest.fixture(scope="module")
def envs():
    from mcgpo.envs import make_env

    made = {
        game: make_env("textworld-express", game=game) for game in ("twc", "cookingworld", "coin")
    }
    yield made
    for env in made.values():
        env.close()


@pytest.mark.twx
@engine_test
@pytest.mark.parametrize("game", ["twc", "cookingworld", "coin"])
def test_gold_path_wins(envs, game):
    env = envs[game]
    for split in ("train", "valid_unseen"):
        obs = env.reset(seed=1, split=split)
        assert obs.task and obs.admissible_actions == tuple(sorted(obs.admissible_actions))
        total, values = 0.0, [obs.context.progress_value]
        for _ in range(env.max_turns):
            res = env.step(env.expert_action())
            assert res.info["action_valid"]
            total += res.reward
            values.append(res.observation.context.progress_value)
            if res.done:
                break
        assert res.info["won"] and total == 10.0 and res.info["score"] == 1.0
        assert values == sorted(values) and values[-1] == 1.0  # the gold path never loses score
    assert env.stats["expert_off_path"] == 0


@pytest.mark.twx
@engine_test
def test_known_twc_state_and_split_folds(envs):
    env = envs["twc"]
    obs = env.reset(seed=0, split="train")  # TWX train seed 0: the bedroom with blue socks
    assert obs.context.state_coarse == "loc=bedroom;hold="
    assert "take clean blue socks" in obs.admissible_actions
    res = env.step("take clean blue socks")
    # TWX twc seed 0 has 8 score points (4 items x take + put): one take = 1 point = 0.125.
    assert res.observation.context.progress == "score=1"
    assert res.observation.context.progress_value == 0.125 and res.info["score_raw"] == 1.0
    assert res.observation.context.state_coarse == "loc=bedroom;hold=clean blue socks"
    assert res.observation.context.state.endswith(";inventory=clean blue socks")
    assert res.reward == 0.0 and not res.done
    # Splits are TWX folds: dev seeds start at 10000, test seeds at 20000.
    env.reset(seed=0, split="valid_seen")
    assert env._engine.getGenerationProperties()["seed"] == 10000
    env.reset(seed=1001, split="valid_unseen")  # seeds wrap around the fold's 1000
    assert env._engine.getGenerationProperties()["seed"] == 20001


@pytest.mark.twx
@engine_test
def test_invalid_commands_and_off_path_expert(envs):
    env = envs["coin"]
    obs = env.reset(seed=2, split="train")
    res = env.step("fly to the moon")
    assert res.observation.text.startswith("Unknown action") and not res.info["action_valid"]
    assert res.observation.context.state == obs.context.state and res.info["turn"] == 1
    res = env.step(12345)  # not text: invalid, never a crash
    assert not res.info["action_valid"]
    assert env.step(" LOOK  around ").info["action_valid"]  # case and spaces normalised
    # Off the gold path the expert is a best effort: a valid action, counted in stats.
    assert env.stats["expert_off_path"] == 0
    assert env.expert_action() in env._valid or env.expert_action() == "look around"
    assert env.stats["expert_off_path"] >= 1
    env2 = envs["twc"]
    env2.reset(seed=0)
    for _ in range(env2.max_turns):
        res = env2.step("inventory")
        if res.done:
            break
    assert res.info["truncated"] and not res.info["won"] and res.info["turn"] == env2.max_turns
    with pytest.raises(twx.TextWorldExpressError, match="after the episode ended"):
        env2.step("look around")


@pytest.mark.twx
@pytest.mark.slow
@engine_test
def test_cli_warm_starts_and_trains_on_textworld_express(tmp_path):
    """`mcgpo sft` and `train` by name (smoke sizes): tokenizer, demos, 2 updates, 3 evals."""
    import json

    from mcgpo.cli import main

    common = ["--preset", "household-smoke", "--env.name", "textworld-express"]
    sft, run = tmp_path / "sft", tmp_path / "train"
    assert main(["sft", *common, "--corpus-episodes", "8", "--out", str(sft)]) == 0
    assert main(["train", *common, "--model", str(sft / "model"), "--out", str(run)]) == 0
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "eval/success" in r]
    assert [r["update"] for r in evals] == [0, 1, 2]
    assert (run / "model" / "config.json").exists()
