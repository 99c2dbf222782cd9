"""Users' own environments: packages registering ``mcgpo.envs`` entry points.

The tests build installed-looking packages in temporary folders: a module plus a
``<name>.dist-info`` folder (METADATA, entry_points.txt), which is all importlib.metadata
reads. The good package is docs/envs/your-own.md's example, taken from that page (its Python
block and its pyproject entry point table), so the documented example is the tested one.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import mcgpo
from mcgpo.cli import main
from mcgpo.envs import BUILT_IN, ENVIRONMENTS, Env, EnvPluginError, make_env
from mcgpo.envs.household import HouseholdEnv

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

# the odd package's "household" entry point warns whenever the plugins are read (tested once)
pytestmark = pytest.mark.filterwarnings("ignore:ignoring entry point 'household:UserWarning")

DOC = Path(__file__).resolve().parents[2] / "docs" / "envs" / "your-own.md"
SRC = Path(mcgpo.__file__).resolve().parents[1]  # the mcgpo under test, for subprocesses


def install(root: Path, dist: str, modules: dict[str, str], entry_points: dict[str, str]) -> Path:
    """Write ``modules`` and a dist-info folder registering ``entry_points`` under mcgpo.envs."""
    root.mkdir(parents=True, exist_ok=True)
    for name, code in modules.items():
        (root / f"{name}.py").write_text(code)
    info = root / f"{dist.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n")
    lines = [f"{name} = {value}" for name, value in entry_points.items()]
    (info / "entry_points.txt").write_text("[mcgpo.envs]\n" + "\n".join(lines) + "\n")
    return root


def doc_example() -> tuple[str, dict[str, str]]:
    """(the module code, the mcgpo.envs entry points) of docs/envs/your-own.md."""
    text = DOC.read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    table = tomllib.loads(re.search(r"```toml\n(.*?)```", text, re.S).group(1))
    return code, table["project"]["entry-points"]["mcgpo.envs"]


@pytest.fixture(scope="module")
def corridor(tmp_path_factory) -> Path:
    code, entry_points = doc_example()
    assert entry_points == {"corridor": "corridor_env:CorridorEnv"}
    return install(
        tmp_path_factory.mktemp("site-good"), "corridor-env", {"corridor_env": code}, entry_points
    )


ODD = """
from mcgpo.envs.household import HouseholdEnv

NOT_CALLABLE = 3


def not_an_env(**options):
    return object()


def shadow(**options):
    raise AssertionError("a plugin must not replace a built-in environment")


def picky(*, size: int = 1):
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    return HouseholdEnv()
"""
ODD_ENTRY_POINTS = {
    "broken": "no_such_module_xyz:make",
    "missing-attr": "odd_plugins:nope",
    "crashes": "odd_crash:make",
    "not-callable": "odd_plugins:NOT_CALLABLE",
    "not-an-env": "odd_plugins:not_an_env",
    "household": "odd_plugins:shadow",
    "picky": "odd_plugins:picky",
}


@pytest.fixture(scope="module")
def odd(tmp_path_factory) -> Path:
    modules = {"odd_plugins": ODD, "odd_crash": 'raise RuntimeError("boom\\nsecond line")\n'}
    return install(tmp_path_factory.mktemp("site-odd"), "odd-plugins", modules, ODD_ENTRY_POINTS)


def run_python(code: str, *paths: Path, args: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), str(SRC), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=600
    )


def test_a_plugin_env_is_listed_built_and_played(corridor, monkeypatch):
    monkeypatch.syspath_prepend(str(corridor))
    assert "corridor" in mcgpo.ENVIRONMENTS
    assert list(ENVIRONMENTS)[: len(BUILT_IN)] == list(BUILT_IN)  # built-ins, then plugins
    assert "corridor" in list(ENVIRONMENTS) and len(ENVIRONMENTS) == len(list(ENVIRONMENTS))
    env = mcgpo.make_env("corridor", length=4)
    assert isinstance(env, Env) and type(env).__name__ == "CorridorEnv"
    obs = env.reset(seed=3)
    assert obs.task == env.reset(seed=3).task  # (seed, split) fixes the task
    for _ in range(env.max_turns):
        res = env.step(env.expert_action())
        if res.done:
            break
    assert res.info["won"] and res.reward == 10.0
    with pytest.raises(ValueError, match="length must be an integer >= 2, got 1"):
        make_env("corridor", length=1)  # the factory's own errors come through unchanged


def test_unknown_names_list_the_plugins(corridor, monkeypatch):
    monkeypatch.syspath_prepend(str(corridor))
    with pytest.raises(ValueError) as err:
        make_env("nope")
    message = str(err.value)
    assert "\n" not in message and "unknown environment 'nope'" in message
    assert "household, webshop, alfworld, textworld-express, remote, corridor" in message


def test_import_mcgpo_imports_no_plugin(corridor):
    code = (
        "import sys, mcgpo\n"
        "assert 'corridor_env' not in sys.modules\n"
        "mcgpo.make_env('household')\n"
        "assert 'corridor' in mcgpo.ENVIRONMENTS and 'corridor' in list(mcgpo.ENVIRONMENTS)\n"
        "assert 'corridor_env' not in sys.modules, 'listed, not built: not imported'\n"
        "mcgpo.make_env('corridor')\n"
        "assert 'corridor_env' in sys.modules\n"
        "print(mcgpo.__file__)\n"
    )
    done = run_python(code, corridor)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(SRC / "mcgpo" / "__init__.py")


def test_built_in_names_win_over_plugins(odd, monkeypatch):
    monkeypatch.syspath_prepend(str(odd))
    with pytest.warns(UserWarning, match=r"ignoring entry point 'household = odd_plugins:shadow'"):
        names = list(ENVIRONMENTS)
    assert names.count("household") == 1 and "picky" in names
    assert ENVIRONMENTS["household"] is BUILT_IN["household"]
    assert isinstance(make_env("household"), HouseholdEnv)


def test_a_factory_set_in_process_wins_over_a_plugin(corridor, monkeypatch):
    monkeypatch.syspath_prepend(str(corridor))
    plugin = ENVIRONMENTS["corridor"]
    with monkeypatch.context() as patch:
        patch.setitem(ENVIRONMENTS, "corridor", lambda **_: HouseholdEnv())
        assert isinstance(make_env("corridor"), HouseholdEnv)
    assert ENVIRONMENTS["corridor"] is plugin  # removed again: the plugin is back


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("broken", "ModuleNotFoundError: No module named 'no_such_module_xyz'"),
        ("missing-attr", "AttributeError: module 'odd_plugins' has no attribute 'nope'"),
        ("crashes", "RuntimeError: boom"),  # the first line of the error only
    ],
)
def test_a_plugin_that_fails_to_load_is_one_line_naming_the_entry_point(
    odd, monkeypatch, name, error
):
    monkeypatch.syspath_prepend(str(odd))
    assert name in ENVIRONMENTS  # listed without importing it
    with pytest.raises(EnvPluginError) as err:
        make_env(name)
    assert isinstance(err.value, ImportError)
    assert str(err.value) == (
        f"entry point '{name} = {ODD_ENTRY_POINTS[name]}' (mcgpo.envs) failed to load: {error}"
    )


def test_a_plugin_that_is_no_env_factory_is_one_line(odd, monkeypatch):
    monkeypatch.syspath_prepend(str(odd))
    with pytest.raises(EnvPluginError, match=r"^entry point 'not-callable = odd_plugins:NOT_"):
        make_env("not-callable")
    with pytest.raises(TypeError) as err:
        make_env("not-an-env")
    assert str(err.value) == (
        "entry point 'not-an-env = odd_plugins:not_an_env' returned an instance of object, "
        "not an Env: it lacks reset, step, expert_action, max_turns"
    )


def test_train_on_a_broken_plugin_exits_2_with_one_line(odd, monkeypatch, tmp_path, capsys):
    monkeypatch.syspath_prepend(str(odd))
    for name, options, error in [
        ("broken", (), "entry point 'broken = no_such_module_xyz:make' (mcgpo.envs) failed"),
        ("picky", ("--env.size", "0"), "size must be >= 1, got 0"),  # the factory's ValueError
        ("picky", ("--env.colour", "red"), "unexpected keyword argument 'colour'"),  # TypeError
    ]:
        args = ["train", "--preset", "household-smoke", "--env.name", name, *options]
        assert main([*args, "--out", str(tmp_path / "run")]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"mcgpo train: error: env {name!r}: ") and error in err, err
        assert err.count("\n") == 1


@pytest.mark.slow
def test_mcgpo_train_runs_on_a_plugin_env(corridor, tmp_path):
    """``mcgpo train --env.name corridor`` in a fresh process, the plugin found on PYTHONPATH."""
    out = tmp_path / "run"
    code = "import sys; from mcgpo.cli import main; sys.exit(main(sys.argv[1:]))"
    args = (
        "train", "--env.name", "corridor", "--env.length", "4", "--preset", "household-smoke",
        "--out", str(out), "--corpus-episodes", "4",
    )  # fmt: skip
    done = run_python(code, corridor, args=args)
    assert done.returncode == 0, done.stderr[-2000:]
    config = tomllib.loads((out / "config.toml").read_text())
    assert config["env"]["name"] == "corridor" and config["env"]["length"] == 4
    assert (out / "model" / "config.json").is_file()
    assert (out / "checkpoints" / "latest").read_text().strip() == "update-000002"
