"""The command line of a measurement run model by model (bench.flash_attention,
bench.first_chunks): --models, --runs, --out; the machine and the load beside the results."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from . import report
from .anchor import MODELS


def main(argv: list[str] | None, *, module: str, doc: str, models: str, runs: int, out: Path,
         run_model: Callable[[str, int], dict], write: Callable[[dict, Path], str]) -> int:
    """Parse argv, run run_model(name, runs) for each model, print write(data, out)."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.split("\n\n")[0])
    parser.add_argument("--models", default=models)
    parser.add_argument("--runs", type=int, default=runs)
    parser.add_argument("--out", type=Path, default=out)
    args = parser.parse_args(argv)
    names = args.models.split(",")
    unknown = set(names) - set(MODELS)
    if unknown:
        parser.error(f"unknown model(s) {', '.join(sorted(unknown))}: pick from "
                     f"{', '.join(MODELS)}")
    data = {"command": f"python -m {module} " + " ".join(sys.argv[1:] if argv is None else argv),
            "date": time.strftime("%Y-%m-%d %H:%M"), "machine": report.machine_info(),
            "load": report.load_average(), "runs": args.runs,
            "models": [run_model(name, args.runs) for name in names]}
    print(write(data, args.out))
    return 0
