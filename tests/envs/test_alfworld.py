"""ALFWorld env: context keys (pure, no extra needed), then the real engine (marked alfworld).

The engine tests generate one game of each of the six task types once per session (seeds
0-5 of train, about 30 s on 2 cores) and play them; the whole file stays under ~2 minutes.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcgpo.envs.alfworld import context as ctx
from mcgpo.envs.alfworld.official import OfficialGames, has_games, task_of
from mcgpo.envs.alfworld_keys import TASK_TYPES as TYPES

HEAT = ctx.TaskSpec("pick_heat_then_place_in_recep", "mug", "diningtable")

# A tiny hand-made heat scene: cabinet 1 @ loc 1, microwave 1 @ loc 2, diningtable 1 @ loc 4;
# the agent starts at loc 3 (no receptacle there: "middle"); mug 1 starts in cabinet 1.
STATIC = (
    ("objecttype", ("apple 1", "appletype")),
    ("objecttype", ("mug 1", "mugtype")),
    ("openable", ("cabinet 1",)),
    ("openable", ("microwave 1",)),
    ("receptacleatlocation", ("cabinet 1", "loc 1")),
    ("receptacleatlocation", ("diningtable 1", "loc 4")),
    ("receptacleatlocation", ("microwave 1", "loc 2")),
    ("receptacletype", ("cabinet 1", "cabinettype")),
    ("receptacletype", ("diningtable 1", "diningtabletype")),
    ("receptacletype", ("microwave 1", "microwavetype")),
)
START = (
    *STATIC,
    ("atlocation", ("agent1", "loc 3")),
    ("inreceptacle", ("apple 1", "diningtable 1")),
    ("inreceptacle", ("mug 1", "cabinet 1")),
)
HOLDING = (  # took mug 1 from the opened cabinet, went to the microwave
    *STATIC,
    ("atlocation", ("agent1", "loc 2")),
    ("holds", ("agent1", "mug 1")),
    ("holdsany", ("agent1",)),
    ("inreceptacle", ("apple 1", "diningtable 1")),
    ("opened", ("cabinet 1",)),
)
HOT = (*HOLDING, ("ishot", ("mug 1",)))
PLACED_HOT = (  # moved the hot mug to the dining table
    *STATIC,
    ("atlocation", ("agent1", "loc 4")),
    ("inreceptacle", ("apple 1", "diningtable 1")),
    ("inreceptacle", ("mug 1", "diningtable 1")),
    ("ishot", ("mug 1",)),
    ("opened", ("cabinet 1",)),
)
PLACED_COLD = tuple(f for f in PLACED_HOT if f[0] != "ishot")


# ---------------------------------------------------------------- context (pure)
def test_state_keys_golden():
    start = ctx.start_of(START)
    assert start == {"apple 1": ("diningtable 1", ""), "mug 1": ("cabinet 1", "")}
    # Nothing changed; loc 3 hosts no receptacle.
    assert ctx.state_keys(START, start) == (
        "loc=middle;hold=nothing;open=;on=;moved=",
        "loc=middle;hold=nothing;open=;on=;moved=",
    )
    # Held objects are not "moved" (they are in no receptacle); instance numbers go in coarse.
    assert ctx.state_keys(HOT, start) == (
        "loc=microwave 1;hold=mug 1(hot);open=cabinet 1;on=;moved=",
        "loc=microwave;hold=mug(hot);open=cabinet;on=;moved=",
    )
    # mug 1 now lies elsewhere (cabinet 1 -> diningtable 1) and is hot; apple 1 is unchanged.
    assert ctx.state_keys(PLACED_HOT, start) == (
        "loc=diningtable 1;hold=nothing;open=cabinet 1;on=;moved=mug 1(hot):cabinet 1>diningtable 1",
        "loc=diningtable;hold=nothing;open=cabinet;on=;moved=mug(hot):cabinet>diningtable",
    )


def test_progress_golden_heat():
    # Rubric (heated, held, placed): 3 items, progress_value = holding / 3.
    assert ctx.progress(START, HEAT, won=False) == ("", 0.0)
    assert ctx.progress(HOLDING, HEAT, won=False) == ("held", 1 / 3)
    assert ctx.progress(HOT, HEAT, won=False) == ("heated,held", 2 / 3)
    # Placed and hot = the goal: every item (held counts once the goal is met).
    assert ctx.progress(PLACED_HOT, HEAT, won=True) == ("heated,held,placed", 1.0)
    # A cold mug on the table is not "placed" (the goal asks for a hot one) and not held.
    assert ctx.progress(PLACED_COLD, HEAT, won=False) == ("", 0.0)


def test_enabled_golden_heat():
    cmds = ("go to cabinet 1", "heat mug 1 with microwave 1", "move mug 1 to microwave 1")
    # Holding an unheated mug at the microwave: only heating advances the rubric (moving it
    # into the microwave is no goal receptacle).
    assert ctx.enabled(HOLDING, HEAT, cmds) == "heat"
    assert ctx.enabled(HOT, HEAT, cmds) == ""  # already hot; not at the goal receptacle
    # At the table with the hot mug in hand, moving it there places it.
    hot_at_table = (*(f for f in HOT if f[0] != "atlocation"), ("atlocation", ("agent1", "loc 4")))
    assert ctx.enabled(hot_at_table, HEAT, ("move mug 1 to diningtable 1",)) == "place"
    # Taking the cold mug back from the table advances "held"; the hot one counts as placed.
    take = ("take mug 1 from diningtable 1", "take apple 1 from diningtable 1")
    assert ctx.enabled(PLACED_COLD, HEAT, take) == "take"
    assert ctx.enabled(PLACED_HOT, HEAT, take) == ""


def test_progress_and_enabled_pick_two_and_look():
    two = ctx.TaskSpec("pick_two_obj_and_place", "cd", "desk")
    base = (
        ("objecttype", ("cd 1", "cdtype")),
        ("objecttype", ("cd 2", "cdtype")),
        ("receptacletype", ("desk 1", "desktype")),
        ("receptacletype", ("desk 2", "desktype")),
    )
    split_up = (*base, ("inreceptacle", ("cd 1", "desk 1")), ("inreceptacle", ("cd 2", "desk 2")))
    together = (*base, ("inreceptacle", ("cd 1", "desk 1")), ("inreceptacle", ("cd 2", "desk 1")))
    # Two goal receptacles with one cd each: only placed_1 (the goal wants both in one).
    assert ctx.progress(split_up, two, won=False) == ("placed_1", 1 / 3)
    assert ctx.progress(together, two, won=True) == ("held,placed_1,placed_2", 1.0)
    # A cd already in a goal-type receptacle is counted: taking it back advances nothing.
    assert ctx.enabled(split_up, two, ("take cd 2 from desk 2",)) == ""

    look = ctx.TaskSpec("look_at_obj_in_light", "book", "", "desklamp")
    lamp = (
        ("objecttype", ("book 1", "booktype")),
        ("objecttype", ("desklamp 1", "desklamptype")),
        ("holds", ("agent1", "book 1")),
        ("inreceptacle", ("desklamp 1", "sidetable 1")),
    )
    assert ctx.progress(lamp, look, won=False) == ("held", 1 / 3)
    assert ctx.enabled(lamp, look, ("use desklamp 1",)) == "light"
    lit = (*lamp, ("istoggled", ("desklamp 1",)))
    assert ctx.progress(lit, look, won=True) == ("held,lamp_on,looked", 1.0)
    assert ctx.enabled(lit, look, ("use desklamp 1",)) == ""  # already on


def test_anchor_golden():
    actions = ("go to cabinet 1", "heat mug 1 with microwave 1")
    assert ctx.anchor("You arrive at microwave 1.", HOT, actions) == (
        "You arrive at microwave 1.\nLocation: microwave 1. Held: mug 1(hot).\n"
        "Actions: go to cabinet 1 | heat mug 1 with microwave 1"
    )


def test_progress_rejects_unknown_task_type():
    with pytest.raises(ValueError, match="unknown ALFWorld task type 'fly'"):
        ctx.progress(START, ctx.TaskSpec("fly", "mug"), won=False)


@settings(max_examples=60, deadline=None)
@given(st.permutations(range(len(PLACED_HOT))), st.booleans())
def test_keys_independent_of_fact_order_and_coarse_of_numbering(order, swap):
    facts = tuple(PLACED_HOT[i] for i in order)
    start = ctx.start_of(START)
    assert ctx.state_keys(facts, start) == ctx.state_keys(PLACED_HOT, start)
    assert ctx.progress(facts, HEAT, True) == ctx.progress(PLACED_HOT, HEAT, True)
    if swap:  # renumber the cabinet: the exact key changes, the coarse key must not
        rename = {"cabinet 1": "cabinet 7"}

        def renamed(fs):
            return tuple((p, tuple(rename.get(a, a) for a in args)) for p, args in fs)

        start2 = ctx.start_of(renamed(START))
        exact2, coarse2 = ctx.state_keys(renamed(facts), start2)
        exact, coarse = ctx.state_keys(PLACED_HOT, start)
        assert coarse2 == coarse and exact2 != exact


def test_task_of_reads_goal_library_goals():
    heat_goal = (
        "(define (problem p) (:domain alfred) (:init) (:goal (and (exists (?r - receptacle) "
        "(exists (?o - object) (and (heatable ?o) (objectType ?o MugType) "
        "(receptacleType ?r DiningTableType) (isHot ?o) (inReceptacle ?o ?r)))))))"
    )
    assert task_of("pick_heat_then_place_in_recep", heat_goal) == HEAT
    look_goal = (
        "(:goal (and (exists (?ot - object ?r - receptacle ?a - agent ?l - location) (and "
        "(objectType ?ot DeskLampType) (toggleable ?ot) (isToggled ?ot))) (exists (?o - object "
        "?a - agent) (and (objectType ?o BookType) (holds ?a ?o)))))"
    )
    assert task_of("look_at_obj_in_light", look_goal) == ctx.TaskSpec(
        "look_at_obj_in_light", "book", "", "desklamp"
    )
    with pytest.raises(ValueError, match="no \\(:goal"):
        task_of("pick_and_place_simple", "(define (problem p))")


def _trial(root: Path, split: str, name: str, traj: str | None, game: str | None) -> Path:
    folder = root / "json_2.1.1" / split / "pick_and_place_simple-X" / name
    folder.mkdir(parents=True)
    if traj is not None:
        (folder / "traj_data.json").write_text(traj)
    if game is not None:
        (folder / "game.tw-pddl").write_text(game)
    return folder


def test_official_collection_reports_broken_files(tmp_path):
    traj = json.dumps({"task_type": "pick_and_place_simple"})
    good = _trial(tmp_path, "train", "trial_b", traj, json.dumps({"solvable": True}))
    _trial(tmp_path, "train", "trial_a", traj, "{not json")  # broken game file
    _trial(tmp_path, "train", "trial_c", "[]", json.dumps({"solvable": True}))  # bad traj_data
    _trial(tmp_path, "train", "trial_d", traj, json.dumps({"solvable": False}))  # unsolvable
    _trial(tmp_path, "train", "trial_e", traj, json.dumps({}))  # no "solvable" key
    movable = _trial(tmp_path, "train", "trial_movable", traj, json.dumps({"solvable": True}))
    assert has_games(tmp_path) and not has_games(tmp_path / "nothing")
    games = OfficialGames(tmp_path)
    assert [g.path for g in games.games("train")] == [good / "game.tw-pddl"]
    assert movable.exists()  # skipped by name, as ALFWorld does
    reasons = "\n".join(games.skipped)
    assert "trial_a/game.tw-pddl: JSONDecodeError" in reasons
    assert "trial_c/traj_data.json: TypeError" in reasons
    assert "trial_e/game.tw-pddl: KeyError" in reasons
    assert len(games.skipped) == 3
    assert games.games("valid_seen") == []


def test_bad_options_are_one_line_errors():
    from mcgpo.envs import make_env
    from mcgpo.envs.alfworld import AlfworldError

    with pytest.raises(AlfworldError, match="unknown alfworld option 'colour'"):
        make_env("alfworld", colour=1)
    with pytest.raises(AlfworldError, match="unknown source 'web'"):
        make_env("alfworld", source="web")
    with pytest.raises(AlfworldError, match="max_turns must be a positive integer"):
        make_env("alfworld", max_turns=0)
    with pytest.raises(AlfworldError, match="task_types must list ALFWorld task types, got 'fly'"):
        make_env("alfworld", task_types=["fly"])
    with pytest.raises(AlfworldError, match=r"source='official' needs json_2\.1\.1"):
        make_env("alfworld", source="official", data_path="/nonexistent")


def test_missing_extra_names_the_install_command(monkeypatch):
    from mcgpo.envs import make_env
    from mcgpo.envs.alfworld import AlfworldNotInstalled, engine

    engine.require_alfworld.cache_clear()
    monkeypatch.setitem(sys.modules, "alfworld", None)  # "import alfworld" now fails
    monkeypatch.setitem(sys.modules, "alfworld.gen", None)
    monkeypatch.setitem(sys.modules, "alfworld.gen.constants", None)
    try:
        with pytest.raises(AlfworldNotInstalled) as err:
            make_env("alfworld", source="generated")
        message = str(err.value)
        assert "pip install 'mcgpo[alfworld]'" in message and "\n" not in message
    finally:
        engine.require_alfworld.cache_clear()


# ---------------------------------------------------------------- the real engine
def _engine_available() -> bool:
    from mcgpo.envs.alfworld.engine import require_alfworld

    try:
        require_alfworld()
    except ImportError:
        return False
    return True


engine_test = pytest.mark.skipif(
    not _engine_available(),
    reason="needs the alfworld extra: pip install 'mcgpo[alfworld]'",
)


def _generated_env(cache: Path):
    """An env whose cache is the session's games (the ``alfworld_cache`` fixture)."""
    from mcgpo.envs import make_env

    return make_env("alfworld", source="generated", cache_dir=cache)


@pytest.mark.alfworld
@engine_test
def test_generated_games_are_gated_and_deterministic(games_root):
    from mcgpo.envs.alfworld.problem import build_game

    for seed, task_type in enumerate(TYPES):
        folder = games_root / "json_2.1.1" / "train" / task_type / f"trial_{seed:07d}"
        game = json.loads((folder / "game.tw-pddl").read_text())
        traj = json.loads((folder / "traj_data.json").read_text())
        assert game["solvable"] is True and game["walkthrough"]
        assert traj["task_type"] == task_type
        assert "UNKNOWN GOAL" not in game["grammar"]
    # Same (split, seed, attempt) -> the same problem text, byte for byte.
    first, again = build_game("valid_unseen", 3, 0), build_game("valid_unseen", 3, 0)
    assert first is not None and first[0]["pddl_problem"] == again[0]["pddl_problem"]
    assert first[1]["scene"]["scene_num"] % 100 <= 6  # held-out scenes for valid_unseen


@pytest.mark.alfworld
@engine_test
def test_expert_wins_all_six_task_types(alfworld_cache):
    env = _generated_env(alfworld_cache)
    argv = list(sys.argv)
    for seed, task_type in enumerate(TYPES):
        obs = env.reset(seed=seed, split="train")
        assert obs.task_type == task_type
        assert obs.text.startswith("-= Welcome to TextWorld, ALFRED! =-")
        assert obs.task.startswith("Your task is to: ") and obs.task in obs.text
        assert "help" in obs.admissible_actions and "look" in obs.admissible_actions
        assert obs.context.progress_value < 1.0
        total, values = 0.0, []
        for _ in range(env.max_turns):
            res = env.step(env.expert_action())
            assert res.info["action_valid"]
            total += res.reward
            values.append(res.observation.context.progress_value)
            if res.done:
                break
        assert res.info["won"] and total == 10.0 and res.info["score"] == 1.0
        assert values[-1] == 1.0 and res.observation.context.enabled == ""
    assert env.stats["replans"] == 0  # the stored walkthrough served every step
    assert sys.argv == argv  # fast-downward's translator rewrites sys.argv; we restore it
    # Sinks are named as ALFWorld names them (not "sinkbasinbasin", see problem.load_scene).
    obs = env.reset(seed=2, split="train")
    assert "sinkbasin 1" in obs.text and "sinkbasinbasin" not in obs.text


@pytest.mark.alfworld
@engine_test
def test_invalid_command_and_replanning_expert(alfworld_cache):
    env = _generated_env(alfworld_cache)
    obs = env.reset(seed=0, split="train")
    res = env.step("dance with the fridge")
    assert res.observation.text == "Nothing happens." and not res.info["action_valid"]
    assert res.reward == 0.0 and not res.done and res.info["turn"] == 1
    assert res.observation.context.state == obs.context.state  # nothing changed
    assert res.observation.admissible_actions == obs.admissible_actions
    # Leave the walkthrough on purpose: the expert re-plans from the new state and still wins.
    detour = next(
        a for a in obs.admissible_actions if a.startswith("go to") and a != env.expert_action()
    )
    env.step("  " + detour.upper() + " ")  # case and spaces are normalised
    assert env.step("inventory").info["action_valid"]
    for _ in range(40):
        res = env.step(env.expert_action())
        if res.done:
            break
    assert res.info["won"] and env.stats["replans"] >= 1
    with pytest.raises(ValueError, match="after the episode ended"):
        env.step("look")


@pytest.mark.alfworld
@engine_test
def test_context_keys_on_a_played_heat_game(alfworld_cache):
    env = _generated_env(alfworld_cache)
    obs = env.reset(seed=3, split="train")  # pick_heat_then_place_in_recep
    task = env.task
    assert obs.context.state == "loc=middle;hold=nothing;open=;on=;moved="
    seen = []
    while True:
        action = env.expert_action()
        res = env.step(action)
        seen.append((action, res.observation.context))
        if res.done:
            break
    for action, c in seen:  # the rubric follows the plan's key steps
        if action.startswith("take "):
            assert c.progress == "held" and c.state.split(";")[1].startswith(f"hold={task.target} ")
        if action.startswith("heat "):
            assert c.progress == "heated,held" and "(hot)" in c.state
        if action.startswith("go to ") and action.split()[2] == task.recep:
            assert c.progress == "heated,held"
    assert seen[-1][1].progress == "heated,held,placed"
    last = seen[-1][1]
    assert "(hot):" in last.state and f">{task.recep} " in last.state
    assert last.state_coarse.count(" ") <= last.state.count(" ") - 2  # numbers dropped


@pytest.mark.alfworld
@engine_test
def test_official_layout_skips_broken_games(games_root, tmp_path):
    """Generated games double as an official-layout data folder; broken trials are skipped."""
    from mcgpo.envs import make_env

    broken = tmp_path / "broken"
    bad_json = broken / "json_2.1.1" / "train" / "pick_and_place_simple-A" / "trial_0"
    bad_pddl = broken / "json_2.1.1" / "train" / "pick_and_place_simple-B" / "trial_0"
    for folder in (bad_json, bad_pddl):
        folder.mkdir(parents=True)
        (folder / "traj_data.json").write_text(json.dumps({"task_type": "pick_and_place_simple"}))
    (bad_json / "game.tw-pddl").write_text('{"solvable": true, "pddl_pro')
    src = games_root / "json_2.1.1" / "train" / TYPES[0] / "trial_0000000" / "game.tw-pddl"
    game = json.loads(src.read_text())
    game["pddl_problem"] = "(define (problem broken) (:domain alfred) (:objects ???"
    (bad_pddl / "game.tw-pddl").write_text(json.dumps(game))
    # Official data = the broken trials + the six good ones (simple type only, to be quick).
    good = games_root / "json_2.1.1" / "train" / TYPES[0]
    shutil.copytree(good, broken / "json_2.1.1" / "train" / "z-good")  # os.walk skips symlinks
    env = make_env("alfworld", data_path=broken, task_types=[TYPES[0]])
    assert env.source == "official"
    obs = env.reset(seed=0, split="train")  # games sorted: A (bad json), B (bad pddl), good
    assert obs.task_type == TYPES[0]
    assert env.stats["games_skipped"] == 1 and "cannot load game" in env.stats["skipped"][0]
    assert any("JSONDecodeError" in s for s in env.official.skipped)
    res = env.step(env.expert_action())
    assert env.stats["replans"] == 1  # official walkthroughs are not trusted as planner plans
    assert res.info["gamefile"].endswith("trial_0000000/game.tw-pddl")


@pytest.mark.alfworld
@engine_test
def test_solvability_gate_rejects_unsolvable_crashing_and_slow_games(games_root, tmp_path):
    from mcgpo.envs.alfworld.generate import check_in_child

    src = games_root / "json_2.1.1" / "train" / TYPES[0] / "trial_0000000" / "game.tw-pddl"
    game = json.loads(src.read_text())
    goal_at = game["pddl_problem"].index("(:goal")
    # A goal on an object type the scene does not have: the engine fails with the
    # KeyError 'val1' the reference reports; the gate turns it into a rejection.
    unsolvable = dict(game)
    head, goal = game["pddl_problem"][:goal_at], game["pddl_problem"][goal_at:]
    unsolvable["pddl_problem"] = head + re.sub(r"\?o \w+Type", "?o BasketBallType", goal, count=1)
    garbage = dict(game, pddl_problem="(define (problem x) (:domain alfred) (:init (foo a)))")
    for name, data in (("unsolvable", unsolvable), ("garbage", garbage)):
        path = tmp_path / f"{name}.tw-pddl"
        path.write_text(json.dumps(data))
        with pytest.raises(ValueError, match="engine error"):
            check_in_child(path, timeout_s=60)
    with pytest.raises(ValueError, match=r"the planner took longer than 0\.001 s"):
        check_in_child(src, timeout_s=0.001)
    assert check_in_child(src, timeout_s=60) == game["walkthrough"]


@pytest.mark.alfworld
@pytest.mark.slow
@engine_test
def test_cli_warm_starts_trains_and_evaluates_on_alfworld(alfworld_cache, tmp_path):
    """`mcgpo sft`, `train` and `eval` by name on generated games (smoke sizes).

    The tokenizer corpus and the demonstrations use training seeds 0-5 (the session's cached
    games); the evaluations play 2 valid_seen games, generated here (a few seconds each).
    """
    from mcgpo.cli import main

    cache = str(alfworld_cache)
    common = ["--preset", "household-smoke", "--env.name", "alfworld", "--env.cache_dir", cache]
    sft, run = tmp_path / "sft", tmp_path / "train"
    assert main(["sft", *common, "--corpus-episodes", "6", "--out", str(sft)]) == 0
    assert (sft / "model" / "config.json").exists()
    assert main(["train", *common, "--model", str(sft / "model"), "--out", str(run)]) == 0
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in records if "time/update" in r and "eval/success" not in r]
    evals = [r for r in records if "eval/success" in r]
    assert len(updates) == 2 and len(evals) == 3  # before the first, after each update
    assert all(0.0 <= r["eval/success"] <= 1.0 for r in evals)
    assert (
        main(["eval", *common, "--model", str(run / "model"), "--out", str(tmp_path / "ev")]) == 0
    )


def test_the_auto_fallback_message_names_the_missing_path(tmp_path):
    from mcgpo.envs.alfworld.env import auto_fallback_message

    assert auto_fallback_message(None) == (
        "alfworld source='auto': $ALFWORLD_DATA is not set and no data_path was given; "
        "playing generated games (set source='official' to require the official ones, or "
        "source='generated' to silence this)"
    )
    assert f"no json_2.1.1/<split>/ under {tmp_path};" in auto_fallback_message(tmp_path)


@pytest.mark.alfworld
@engine_test
def test_auto_falls_back_to_generated_games_with_one_warning(tmp_path, monkeypatch):
    import warnings

    from mcgpo.envs import make_env
    from mcgpo.envs.alfworld.env import AlfworldFallbackWarning

    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    with pytest.warns(AlfworldFallbackWarning, match=f"under {tmp_path};") as caught:
        env = make_env("alfworld", source="auto", data_path=tmp_path, cache_dir=tmp_path)
    assert env.source == "generated" and len(caught) == 1
    assert "\n" not in str(caught[0].message)
    with pytest.warns(AlfworldFallbackWarning, match=r"\$ALFWORLD_DATA is not set"):
        make_env("alfworld", cache_dir=tmp_path)  # auto is the default
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # named sources never warn
        assert make_env("alfworld", source="generated", cache_dir=tmp_path).source == "generated"
