"""Every ``mcgpo ...`` command line printed in README.md and docs/**/*.md parses against the
real command line, so that the docs cannot drift from the CLI.

Each line of a fenced code block (shell, text or unlabelled; ``\\`` continuations joined,
comments dropped) whose program is ``mcgpo`` (also ``path/to/mcgpo``, ``python -m mcgpo``,
``torchrun ... -m mcgpo``, after ``VAR=value`` and ``nice``/``srun``/``time``) is checked with
the CLI's own functions, in this process, without running anything:

* the command exists (:data:`mcgpo.cli.COMMANDS`, ``DELEGATED``, ``NAMED``);
* ``sft | train | eval``: every option exists for the command
  (:func:`~mcgpo.training.overrides.parse_flags`), the preset, the values and the resolved
  config (:func:`~mcgpo.training.overrides.resolve_command`), ``train``'s algorithm options
  (:func:`~mcgpo.training.algorithms.resolve_algo`) and the environment's name and option
  names (one environment built; a served environment's options are the server's, a missing
  extra or Java is not the line's fault);
* ``bench | ablate | sweep``: their parser (:func:`~mcgpo.bench.commands.parse_study`), the
  line-only checks and every run's config (:func:`~mcgpo.bench.study.study_configs`);
* ``env serve``, ``export``, ``alfworld-generate``, ``report``, ``presets``: their parsers
  and value checks, with the work itself (serving, merging, generating) left out.

What needs the filesystem is left out of the check, not the line: the folders a line names
(``--model``, ``--out``, ``--run``, a run to resume or report, a token file). Lines that
are placeholders (``<option>``, ``...``, a synopsis's ``[--port N]``) are skipped; shell expansions (``$(seq ...)``,
``$NODE_RANK``) stand for ``0``. Nothing imports torch.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
NOT_SHELL = {"python", "py", "toml", "json", "yaml", "yml", "jsonc", "ini"}
WRAPPERS = {"nice", "time", "srun", "exec"}
# Environments a page builds and installs as a plugin before its command line runs.
DOCS_PLUGINS = {"corridor"}  # docs/envs/your-own.md (tests/envs/test_entry_points.py runs it)
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")
PLACEHOLDER = re.compile(r"<[^<>]*>|\.\.\.|…|\[--")  # [--opt X]: a usage synopsis
EXPANSION = re.compile(r"\$\([^)]*\)|\$\{\w+\}|\$\w+")


# ---------------------------------------------------------------------- finding the lines
def fenced_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of every shell-like fenced block, ``\\`` continuations joined."""
    inside, fence, lines = False, "", []
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if not inside and match:
            inside, fence, lines = True, match.group(2), []
            language = match.group(3).strip().split(" ")[0].lower()
        elif inside and match and match.group(2).startswith(fence) and not match.group(3).strip():
            inside = False
            if language not in NOT_SHELL:
                yield from _joined(lines)
        elif inside:
            lines.append((number, line))


def _joined(lines: list[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    start, parts = None, []
    for number, line in lines:
        start = number if start is None else start
        if line.rstrip().endswith("\\"):
            parts.append(line.rstrip()[:-1].strip())
            continue
        parts.append(line.strip())
        yield start, " ".join(p for p in parts if p)
        start, parts = None, []
    if parts:
        yield start or 0, " ".join(parts)


def mcgpo_argv(line: str) -> list[str] | None:
    """The arguments after ``mcgpo`` of a command line that runs it, else None (other
    programs, console output such as ``mcgpo train: error: ...``, placeholders)."""
    if "mcgpo" not in line or PLACEHOLDER.search(line):
        return None
    try:
        tokens = shlex.split(EXPANSION.sub("0", line), comments=True)
    except ValueError:  # unbalanced quotes: prose, not a command
        return None
    i = 0
    while i < len(tokens) and (re.match(r"^\w+=", tokens[i]) or tokens[i] in WRAPPERS):
        i += 1
    if i < len(tokens) and (tokens[i] == "mcgpo" or tokens[i].endswith("/mcgpo")):
        argv = tokens[i + 1 :]
    elif "-m" in tokens[i:] and tokens[tokens.index("-m", i) + 1 :][:1] == ["mcgpo"]:
        argv = tokens[tokens.index("-m", i) + 2 :]
    else:
        return None
    if argv and argv[0].endswith(":"):  # console output: "mcgpo train: error: ..."
        return None
    return argv


def docs_commands() -> list[tuple[str, list[str]]]:
    """("page:line", argv) of every mcgpo command line in the README and the docs."""
    found = []
    for page in PAGES:
        for number, line in fenced_lines(page.read_text(encoding="utf-8")):
            argv = mcgpo_argv(line)
            if argv is not None:
                found.append((f"{page.relative_to(ROOT)}:{number}", argv))
    return found


# ---------------------------------------------------------------------- checking one line
def problem(argv: list[str]) -> str | None:
    """What is wrong with ``mcgpo <argv>`` as the CLI parses it (one line), or None."""
    from mcgpo.cli import COMMANDS, DELEGATED, NAMED
    from mcgpo.training.config import ConfigError

    if not argv or argv[0] in ("-h", "--help"):
        return None
    command, rest = argv[0], argv[1:]
    if command not in (*COMMANDS, *DELEGATED, *NAMED):
        return f"unknown command {command!r}"
    checks: dict[str, Callable[[str, list[str]], str | None]] = {
        **dict.fromkeys(COMMANDS, _run_command),
        **dict.fromkeys(("bench", "ablate", "sweep"), _study),
        "env": _env_serve,
        "export": _export,
        "alfworld-generate": _alfworld_generate,
        "report": _own_parser,
        "presets": _own_parser,
    }
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return checks[command](command, rest)
    except ConfigError as error:
        return str(error)
    except SystemExit as stop:  # an argparse parser or split_items: one line on stderr
        if stop.code in (0, None):  # --help
            return None
        return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else str(stop)


def _run_command(command: str, rest: list[str]) -> str | None:
    from mcgpo.training.algorithms import resolve_algo
    from mcgpo.training.overrides import parse_flags, resolve_command

    rest = [a for a in rest if a not in ("-h", "--help")]
    flags = parse_flags(command, rest)  # every --option exists for the command
    # the values as given (--run DIR left out: it needs the run folder on disk)
    cfg = resolve_command(command, [f"--{key}={value}" for key, value in flags.values.items()])
    if command == "train":
        resolve_algo(cfg.algo, cfg.rollout.group_size)
    return env_problem(cfg.env.name, dict(cfg.env.options))


_BUILT: dict[tuple[str, str], str | None] = {}


def env_problem(name: str, options: dict[str, object]) -> str | None:
    """An unknown environment, or an option it does not take (one built, as the preflight
    builds it); a served environment's options are its server's, a missing extra (or Java)
    and a value the environment refuses here (data, a server) are not checked."""
    from mcgpo.envs import env_named
    from mcgpo.options import parse_scalar

    if name in DOCS_PLUGINS or name == "remote":
        return None
    try:
        make = env_named(name)
    except ValueError as err:
        return str(err)
    typed = {k: parse_scalar(v) if isinstance(v, str) else v for k, v in options.items()}
    key = (name, repr(sorted(typed.items())))
    if key not in _BUILT:
        _BUILT[key] = None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # alfworld's generated-games notice
                make(**typed)
        except ImportError:
            pass
        except (ValueError, TypeError) as err:
            text = str(err).splitlines()[0]
            if text.startswith(f"unknown {name} option") or "unexpected keyword" in text:
                _BUILT[key] = f"env {name!r}: {text}"
    return _BUILT[key]


def _study(command: str, rest: list[str]) -> str | None:
    from mcgpo.bench.commands import parse_study
    from mcgpo.bench.study import StudyError, study_configs

    args, variants = parse_study(command, rest)
    try:
        configs = study_configs(args, variants)
    except StudyError as err:
        return str(err)
    return env_problem(configs[0].env.name, dict(configs[0].env.options)) if configs else None


def _env_serve(command: str, rest: list[str]) -> str | None:
    from mcgpo.envs.serving import command as serving

    served: dict[str, object] = {}

    def serve(env: str, options: dict[str, object], **_: object) -> int:
        served.update(env=env, options=options)
        return 0

    with (
        mock.patch.object(serving, "read_token", lambda path: "token"),
        mock.patch.object(serving, "token_file_warning", lambda path: None),
    ):
        try:
            import mcgpo.envs.serving.launch as launch
        except ImportError:  # the serve extra is missing: the parser and checks still ran
            launch = None
        with mock.patch.object(launch, "serve", serve) if launch else contextlib.nullcontext():
            err = io.StringIO()
            try:
                with contextlib.redirect_stderr(err):
                    code = serving.main(rest)
            except SystemExit as stop:  # its parser: one line on stderr, exit 2
                code = stop.code
    text = err.getvalue().strip()
    if code not in (0, None) and "install the serve extra" not in text:
        return text.splitlines()[-1] if text else f"exit code {code}"
    if served:
        return env_problem(str(served["env"]), dict(served["options"]))  # type: ignore[arg-type]
    return None


def _export(command: str, rest: list[str]) -> str | None:
    from mcgpo.training import export

    with mock.patch.object(export, "export_merged", lambda run, out=None: Path("merged")):
        export.main(rest)  # the folder itself is on disk: not checked
    return None


def _alfworld_generate(command: str, rest: list[str]) -> str | None:
    try:
        from mcgpo.envs.alfworld import generate
    except ImportError:  # the alfworld extra is missing
        return None
    with mock.patch.object(generate, "generate_games", lambda *a, **k: []):
        generate.main(rest)
    return None


def _own_parser(command: str, rest: list[str]) -> str | None:
    from mcgpo.cli import UsageError, build_parser

    try:
        build_parser().parse_args([command, *rest])  # report's folders: on disk, not checked
    except UsageError as err:
        return str(err)
    return None


# ---------------------------------------------------------------------- the tests
COMMAND_LINES = docs_commands()


def test_the_docs_hold_command_lines_of_every_kind():
    commands = {argv[0] for _, argv in COMMAND_LINES if argv}
    assert {"train", "sft", "eval", "bench", "report", "env", "export"} <= commands
    assert len(COMMAND_LINES) >= 40


@pytest.mark.parametrize(("where", "argv"), COMMAND_LINES, ids=[w for w, _ in COMMAND_LINES])
def test_every_docs_command_line_parses(where, argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no run folder of this checkout changes what a line means
    assert problem(argv) is None, f"{where}: mcgpo {shlex.join(argv)}: {problem(argv)}"


def test_the_check_catches_drift_and_leaves_out_only_what_needs_the_disk(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    smoke = ["--preset", "household-smoke"]
    assert problem(["trian", *smoke]) == "unknown command 'trian'"
    assert problem(["train", *smoke, "--train.lrr", "1e-4"]) == (
        "unknown option --train.lrr (did you mean '--train.lr'?)"
    )
    assert problem(["sft", "--out", "runs/a", "--corpus-episode", "6"]) is not None
    assert problem(["train", "--train.lr", "fast"]) == "train.lr: expected a number, got 'fast'"
    assert "unknown preset 'household-smok'" in str(problem(["eval", "--preset", "household-smok"]))
    assert "did you mean 'omega'" in str(problem(["train", "--algo.omeg", "0.5"]))
    assert "option 'max_turn' (did you mean 'max_turns'?)" in str(
        problem(["sft", "--env.max_turn", "3"])
    )
    assert "did you mean '--train.lr'" in str(problem(["bench", "--set", "train.lrr=1"]))
    assert "unknown algorithm 'nope'" in str(problem(["bench", "--algos", "grpo,nope"]))
    assert "unknown sweep parameter" in str(problem(["sweep", "--params", "algo.omega"]))
    assert "--port" in str(problem(["env", "serve", "--env", "household", "--port", "x"]))
    assert "did you mean 'n_receptacles'" in str(
        problem(["env", "serve", "--env", "household", "--env.n_receptacle", "12"])
    )
    assert "--merge" in str(problem(["export", "runs/lora"]))
    assert problem(["report", "runs/a", "--plott"]) is not None
    # what names a folder is not checked (the line is): none of these exists here
    assert problem(["eval", "--run", "runs/nowhere", "--eval.tasks", "8"]) is None
    assert problem(["eval", "--run", "runs/nowhere", "--eval.taks", "8"]) is not None
    assert problem(["train", "--resume", "--out", "runs/nowhere", "--model", "m/none"]) is None
    assert problem(["bench", *smoke, "--model", "m/none", "--algos", "grpo"]) is None
    assert problem(["export", "--merge", "runs/nowhere"]) is None
    assert problem(["env", "serve", "--env", "household", "--host", "0.0.0.0",
                    "--token-file", "no/such/file"]) is None  # fmt: skip
    assert problem(["train", "--help"]) is None and problem(["--help"]) is None


def test_the_lines_are_read_as_a_shell_reads_them():
    page = "\n".join([
        "```bash",
        "mcgpo train --preset household-smoke \\",
        "    --out runs/a   # a comment",
        "WANDB_MODE=offline nice mcgpo eval --model runs/a/model",
        'torchrun --nproc-per-node 2 -m mcgpo train --seeds $(seq -s, 0 3) --out "runs/$NAME"',
        ".venv-vllm/bin/mcgpo sft --out x",
        "pip install mcgpo  # not a command of mcgpo's",
        "mcgpo train --env.<option> VALUE",
        "mcgpo train --preset household-smoke ...",
        "```",
        "```text",
        "mcgpo train: error: env 'x': unknown",
        "```",
        "```python",
        "mcgpo train --in-python",
        "```",
        "mcgpo train --outside-a-fence",
    ])  # fmt: skip
    found = [(n, mcgpo_argv(line)) for n, line in fenced_lines(page)]
    assert [(n, argv) for n, argv in found if argv is not None] == [
        (2, ["train", "--preset", "household-smoke", "--out", "runs/a"]),
        (4, ["eval", "--model", "runs/a/model"]),
        (5, ["train", "--seeds", "0", "--out", "runs/0"]),
        (6, ["sft", "--out", "x"]),
    ]


def test_checking_every_docs_line_imports_neither_torch_nor_transformers(tmp_path):
    probe = (
        "import json, sys; import test_docs_commands as t; "
        "bad = [w for w, a in t.COMMAND_LINES if t.problem(a)]; "
        "print(json.dumps([bad, [m for m in ('torch', 'transformers') if m in sys.modules]]))"
    )
    path = os.pathsep.join(
        [str(ROOT / "src"), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": path}, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    bad, heavy = json.loads(done.stdout.strip().splitlines()[-1])
    assert bad == [] and heavy == []
