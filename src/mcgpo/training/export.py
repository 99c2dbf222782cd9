"""``mcgpo export --merge RUN``: a LoRA run's adapters merged into a plain model folder.

``RUN`` is a run folder (its ``model/`` is then the adapter folder) or an adapter folder
itself (a checkpoint's ``model/``). The adapters are loaded onto the base model their
``adapter_config.json`` names and merged by PEFT (:func:`mcgpo.policy.load_policy`);
the merged model and the tokenizer go to ``--out`` (default: ``merged`` beside the adapter
folder, i.e. ``RUN/merged`` for a run folder), written into
a temporary folder first and renamed into place, so an interrupted export leaves no half
folder. The same folder as ``train.lora_merge true`` writes at the end of a run.
Bad input (no folder there, a run without LoRA (its ``model/`` is already a plain model
folder), no adapter folder, a base that cannot be loaded, an ``--out`` that exists, a
command-line mistake) is one line, exit 2.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from mcgpo.command_line import OneLineParser
from mcgpo.model_names import is_adapter_folder

__all__ = ["main"]


def main(argv: Sequence[str]) -> int:
    parser = OneLineParser(
        prog="mcgpo export",
        description="write a LoRA run's adapters merged into a plain model folder",
    )
    parser.add_argument("--merge", action="store_true", required=True,
                        help="merge the adapters into the base weights (the only export)")  # fmt: skip
    parser.add_argument("run", help="a run folder (its model/) or an adapter folder")
    parser.add_argument("--out", default=None, help="where to write (default RUN/merged)")
    args = parser.parse_args(list(argv))
    try:
        folder = export_merged(Path(args.run), Path(args.out) if args.out else None)
    except ValueError as err:
        print(f"mcgpo export: error: {err}", file=sys.stderr)
        return 2
    print(f"merged model written to {folder}")
    return 0


def export_merged(run: Path, out: Path | None = None) -> Path:
    """Merge the adapters of ``run`` into a plain model folder; returns it (module doc)."""
    adapters = run / "model" if is_adapter_folder(run / "model") else run
    if not run.is_dir():
        raise ValueError(f"{str(run)!r}: no such folder (give a run folder or its model/)")
    plain = next((p for p in (run, run / "model") if (p / "config.json").is_file()), None)
    if not is_adapter_folder(adapters) and plain is not None:
        raise ValueError(
            f"{str(run)!r} is not a LoRA run: {str(plain)!r} is already a plain model folder "
            "(nothing to merge; pass it as --model as it is)"
        )
    if not is_adapter_folder(adapters):
        raise ValueError(
            f"{str(run)!r} holds no LoRA adapter folder (adapter_config.json, in it or in "
            f"its model/); was the run trained with train.lora_rank > 0?"
        )
    # a run folder: RUN/merged (beside its model/); an adapter folder: a sibling "merged"
    target = out or adapters.parent / "merged"
    if target.exists():
        raise ValueError(f"--out {str(target)!r} exists; remove it or name another folder")
    from mcgpo.policy import load_policy, save_policy  # checked: now load (torch)

    model, tokenizer = load_policy(adapters)  # PolicyLoadError (a ValueError): one line
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        save_policy(model, tokenizer, tmp)
        os.replace(tmp, target)
    except OSError as err:  # an --out that cannot be written: one line, no half folder left
        shutil.rmtree(tmp, ignore_errors=True)
        reason = err.strerror or type(err).__name__
        raise ValueError(
            f"--out {str(target)!r}: cannot write the merged model ({reason})"
        ) from None
    return target
