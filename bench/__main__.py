"""Reame benchmark: reame vs no cache vs LlamaDiskCache, side by side, on one model and machine
(and, for several users at once, server processes over HTTP: bench/users.py).

    python -m bench                 full run (default model, plus the larger random-weight
                                    shapes found in bench/cache/, see bench/make_models.py)
    python -m bench --quick         every scenario, shortened (a couple of minutes)

Writes results.md, results.json and PNG plots to --out and prints the tables.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import resource
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from . import batching, plan_cost, report, scenarios, users
from .scenarios import Context, Plan
from .servers import KINDS

log = logging.getLogger("bench")

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = ROOT / "bench" / "results"
SHAPES_DIR = ROOT / "bench" / "cache"
ALL = ("1", "2", "3", "4", "5", "6", "7", "users", "batch", "kv", "restore", "plan")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="fewer sizes, one run each, fewer turns (a couple of minutes)")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL,
                        help="GGUF model (default: %(default)s)")
    parser.add_argument("--out", type=Path,
                        help=f"results folder (default: {DEFAULT_OUT.relative_to(ROOT)}, "
                             "or its quick/ subfolder with --quick)")
    parser.add_argument("--runs", type=int, help="runs per measurement (median); default 3, "
                        "1 with --quick")
    parser.add_argument("--threads", type=int, default=0,
                        help="llama.cpp threads per system (default 0: all cores, as reame)")
    parser.add_argument("--scenarios", default=",".join(ALL),
                        help="comma-separated subset of %(default)s")
    parser.add_argument("--shapes", type=Path, nargs="*",
                        help="larger-shape GGUFs for the shortened scenario 1 (default: the "
                             "*.gguf in bench/cache/ on a full run, none with --quick)")
    parser.add_argument("--work", type=Path, help="scratch folder (default: a temp folder, "
                        "deleted at the end)")
    parser.add_argument("--sizes", help="comma-separated history lengths for scenario 1 "
                        "(and the shapes' run), instead of the plan's")
    parser.add_argument("--users", help="comma-separated numbers of users at once for the "
                        "several-users scenario (default 1,2,4,8; --quick 1,2,4; shapes 1,4)")
    parser.add_argument("--user-systems", default=",".join(KINDS),
                        help="comma-separated servers for the several-users scenario, of "
                             "%(default)s (reame: [model] slots = the most users; serial: "
                             "slots = 1; llama-server: python -m llama_cpp.server)")
    parser.add_argument("--add-to", type=Path, metavar="RESULTS_JSON",
                        help="run only the --shapes and add them to an existing results.json "
                             "(its folder gets the new results.md and plots)")
    parser.add_argument("--report-only", type=Path, metavar="RESULTS_JSON",
                        help="only rewrite results.md and the plots from a results.json")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    args = parser.parse_args(argv)
    unknown = set(args.scenarios.split(",")) - set(ALL)
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(sorted(unknown))}: pick from {', '.join(ALL)}")
    if args.users and not all(x.strip().isdigit() and int(x) > 0 for x in args.users.split(",")):
        parser.error(f"--users {args.users}: expected positive numbers, e.g. 1,2,4,8")
    unknown = set(args.user_systems.split(",")) - set(KINDS)
    if unknown:
        parser.error(f"unknown user system(s) {', '.join(sorted(unknown))}: pick from "
                     f"{', '.join(KINDS)}")
    return args


def model_info(path: Path) -> dict:
    """Name, size and (for generated shapes) the description make_models.py left beside it."""
    info = {"name": path.name, "path": str(path), "bytes": path.stat().st_size}
    sidecar = path.with_suffix(".json")
    if sidecar.exists():
        meta = json.loads(sidecar.read_text())
        info["description"] = meta.get("description", "")
        info["note"] = ", random weights"
    return info


def run_main_model(ctx: Context, wanted: set[str], results: dict, done) -> dict:
    """The wanted scenarios on the main model, most telling first, into results; done() is
    called after each (so a run stopped half-way leaves what it measured). Returns the wall
    seconds of each."""
    steps = [
        ("1", "s1", scenarios.restart_and_continue),
        ("kv", "kv", scenarios.kv_bytes_per_token),
        ("restore", "restore", lambda c: _restore(c, results.get("s1"))),
        ("4", "s4", scenarios.low_overlap),
        ("6", "s6", scenarios.over_time),
        ("2", "s2", scenarios.switching),
        ("3", "s3", scenarios.shared_prefix),
        ("5", "s5", scenarios.edit_middle),
        ("7", "s7", scenarios.long_chat),
        ("users", "users", users.several_users),
        ("batch", "batch", batching.batched_vs_in_turn),
        ("plan", "plan", plan_cost.batch_plan_cost),
    ]
    walls = {}
    for name, key, fn in steps:
        if name in wanted:
            results[key], walls[key] = _timed_scenario(name, fn, ctx)
            results["save"] = scenarios.save_share(results)
            done(walls)
    return walls


def _timed_scenario(name: str, fn, ctx: Context):
    log.info("=== scenario %s (%s) ===", name, ctx.model.name)
    started = time.perf_counter()
    out = fn(ctx)
    wall = time.perf_counter() - started
    log.info("=== scenario %s done in %.1f s ===", name, wall)
    return out, wall


def _restore(ctx: Context, s1: dict | None) -> dict:
    """Restore throughput on scenario 1's reame file closest to plan.restore_tokens (built
    here if scenario 1 did not run)."""
    if s1 is None:
        ctx = replace(ctx, plan=replace(ctx.plan, sizes=(ctx.plan.restore_tokens,), runs=1),
                      systems=(scenarios.REAME,))
        s1 = scenarios.restart_and_continue(ctx)
    bases = s1["_bases"]
    size = min(bases, key=lambda s: abs(s - ctx.plan.restore_tokens))
    folder, chat_id = bases[size]
    return scenarios.restore_throughput(ctx, folder, chat_id)


def run_shape(path: Path, work: Path, runs: int | None, threads: int,
              sizes: tuple[int, ...] | None = None, *, several: dict | None = None,
              wanted: set[str] = frozenset(ALL)) -> dict:
    """The shortened run on a larger shape, of the wanted scenarios among KV bytes per token,
    scenario 1 and batch; several users too when several holds its Plan changes
    (users_systems, and users if asked)."""
    plan = replace(Plan.shapes_plan(), threads=threads)
    if sizes:
        plan = replace(plan, sizes=sizes)
    if runs:
        plan = replace(plan, runs=runs)
    ctx = Context(path, work / path.stem, plan)
    out = {}
    if "kv" in wanted:
        out["kv"], _ = _timed_scenario("kv", scenarios.kv_bytes_per_token, ctx)
    if "1" in wanted:
        out["s1"], _ = _timed_scenario("1", scenarios.restart_and_continue, ctx)
    if "batch" in wanted:
        out["batch"], _ = _timed_scenario("batch", batching.batched_vs_in_turn, ctx)
    if several is not None:
        out["users"], _ = _timed_scenario("users", users.several_users,
                                          replace(ctx, plan=replace(plan, **several)))
    return out


def several_users_options(args: argparse.Namespace) -> dict | None:
    """The Plan changes --users and --user-systems ask for; None if the scenario is not run."""
    if "users" not in args.scenarios.split(","):
        return None
    changes = {"users_systems": tuple(KINDS[k] for k in args.user_systems.split(","))}
    if args.users:
        changes["users"] = tuple(sorted({int(x) for x in args.users.split(",")}))
    return changes


def strip_private(obj):
    """Drop keys starting with _ (paths kept for later steps) before writing JSON."""
    if isinstance(obj, dict):
        return {k: strip_private(v) for k, v in obj.items() if not str(k).startswith("_")}
    if isinstance(obj, list):
        return [strip_private(v) for v in obj]
    return obj


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.shapes:  # servers run from other folders: their reame.conf needs whole paths
        args.shapes = [p.resolve() for p in args.shapes]
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if args.report_only:
        results = json.loads(args.report_only.read_text())
        write(results, args.out or args.report_only.parent, final=True, recompute=False)
        return 0
    started = time.perf_counter()
    plan = Plan.quick_plan() if args.quick else Plan()
    if args.runs:
        plan = replace(plan, runs=args.runs)
    plan = replace(plan, threads=args.threads)
    several = several_users_options(args)
    plan = replace(plan, **(several or {}))
    sizes = tuple(int(x) for x in args.sizes.split(",")) if args.sizes else None
    if sizes:
        plan = replace(plan, sizes=sizes)
    if args.add_to:
        return add_shapes(args, sizes)
    out = args.out or (DEFAULT_OUT / "quick" if args.quick else DEFAULT_OUT)
    shapes = args.shapes if args.shapes is not None else (
        [] if args.quick else sorted(SHAPES_DIR.glob("*.gguf")))
    model = args.model.resolve()
    if not model.exists():
        log.error("model not found: %s (run `make model`)", model)
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="reame-bench-"))
    run_info = {"date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
                "command": "python -m bench " + shlex.join(sys.argv[1:] if argv is None else argv),
                "quick": args.quick, "load_start": report.load_average(),
                "n_ctx": plan.n_ctx, "max_tokens": plan.max_tokens, "plan": plan.__dict__,
                "threads": args.threads}
    results = {"run": run_info, "machine": report.machine_info(), "models": [], "notes": []}
    main_entry = {**model_info(model), "scenarios": {}}
    results["models"].append(main_entry)
    wanted = [n for n in ALL if n in args.scenarios.split(",")]
    pending = [*wanted, *(p.name for p in shapes)]

    def done(walls: dict, finished: str | None = None) -> None:
        """Write what is measured so far (the tables say what is still to come)."""
        if finished and finished in pending:
            pending.remove(finished)
        for key in walls:
            name = key.removeprefix("s")
            if name in pending:
                pending.remove(name)
        run_info.update(wall_s=time.perf_counter() - started, load_end=report.load_average(),
                        cpu_s=round(sum(resource.getrusage(resource.RUSAGE_SELF)[:2]), 1),
                        scenario_wall_s={k: round(v, 1) for k, v in walls.items()},
                        pending=list(pending))
        write(results, out, final=not pending)

    try:
        walls = run_main_model(Context(model, work / "main", plan), set(wanted),
                               main_entry["scenarios"], done)
        for shape in shapes:
            try:
                results["models"].append({**model_info(shape),
                                          "scenarios": run_shape(shape, work / "shapes", args.runs,
                                                                     args.threads, sizes,
                                                                     several=several,
                                                                     wanted=set(wanted))})
            except Exception as exc:  # a broken generated model must not lose the main results
                log.exception("shape %s failed", shape.name)
                results["notes"].append(f"{shape.name}: not measured ({exc})")
            done(walls, shape.name)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    if pending:  # nothing was left to measure after the last write
        done(walls)
    log.info("wrote %s in %.1f min", out / "results.md", run_info["wall_s"] / 60)
    return 0


def add_shapes(args: argparse.Namespace, sizes: tuple[int, ...] | None) -> int:
    """Run the shapes alone and add them to an existing results.json (e.g. after a run that
    was stopped before its shapes)."""
    results = json.loads(args.add_to.read_text())
    work = args.work or Path(tempfile.mkdtemp(prefix="reame-bench-"))
    out = args.out or args.add_to.parent
    try:
        for shape in args.shapes or []:
            started = time.perf_counter()
            results["models"] = [m for m in results["models"] if m["name"] != shape.name]
            results["models"].append({**model_info(shape), "scenarios": run_shape(
                shape, work, args.runs, args.threads, sizes,
                several=several_users_options(args), wanted=set(args.scenarios.split(",")))})
            pending = results["run"].get("pending", [])
            results["run"]["pending"] = [p for p in pending if p != shape.name]
            results["notes"].append(
                f"{shape.name} was run afterwards with `python -m bench "
                f"{shlex.join(sys.argv[1:])}` ({(time.perf_counter() - started) / 60:.1f} min, "
                f"load average at its end {report.load_average()}).")
            write(results, out, final=False, recompute=False)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    write(results, out, final=True, recompute=False)
    return 0


def write(results: dict, out: Path, *, final: bool, recompute: bool = True) -> None:
    """results.json, the plots and results.md in out; the tables to stdout when final.
    recompute=False: results already hold their targets and notes (--report-only)."""
    main_scenarios = results["models"][0]["scenarios"]
    clean = strip_private({**results, "targets": report.targets(main_scenarios),
                           "notes": report.findings(main_scenarios) + results["notes"]}
                          if recompute else results)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(clean, indent=1, default=str))
    names = report.plots(clean, out)
    text = report.markdown(clean, names)
    (out / "results.md").write_text(text)
    if final:
        print(text)

if __name__ == "__main__":
    sys.exit(main())
