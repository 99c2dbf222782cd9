"""The parts of benchmarks/gpu/gpu_check.py, each run in a process of its own.

    PYTHONPATH=src python benchmarks/gpu/gpu_check_parts.py --part a --result FILE --work DIR [--dry]

One process per part (started and killed by gpu_check.py): it starts up (imports, the CUDA
context), writes ``--result`` with status ``running`` (from then on the part's time limit
counts), builds its model, measures, and rewrites ``--result`` (JSON, atomically: a
temporary file, then ``os.replace``) after every group of rows, so that the rows measured
before a kill or a crash survive. The file holds ``status`` (running, ok, error), ``rows``
([measure, value, note]), ``env`` (device and versions) and, on an error, ``why`` (one
line). The parts live in gpu_check_sampling.py (a, c), gpu_check_update.py (b, e) and
gpu_check_train.py (d), gpu_check_training.py (f); see gpu_check.py for what each measures.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check_context import Part, one_line, throughput

# part -> (module, function) in this folder, imported once the part has started up
PARTS = {
    "a": ("gpu_check_sampling", "part_sampler"),
    "b": ("gpu_check_update", "part_update"),
    "c": ("gpu_check_sampling", "part_pi_old"),
    "d": ("gpu_check_train", "part_train"),
    "e": ("gpu_check_update", "part_compiled"),
    "f": ("gpu_check_training", "part_training"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", required=True, choices=sorted(PARTS))
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--dry", action="store_true")
    parser.add_argument("--fault", default=None)
    parser.add_argument("--bandwidth", type=float, default=throughput.H200_BYTES_PER_S)
    parser.add_argument("--peak-flops", type=float, default=throughput.H200_BF16_FLOPS)
    args = parser.parse_args(argv)
    part = Part(
        args.part, args.result, args.work, args.dry, args.fault, args.bandwidth, args.peak_flops
    )  # fmt: skip  (its first result write ends the start-up)
    if part.device.type == "cuda":
        import torch

        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    try:
        if part.fault and not part.fault_after:
            part.inject()
        module, name = PARTS[args.part]
        getattr(importlib.import_module(module), name)(part)
        part.sync()  # an asynchronous CUDA error surfaces here, inside this part
    except Exception as err:
        part.write("error", one_line(err))
        traceback.print_exc()
        return 1
    part.write("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
