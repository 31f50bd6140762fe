"""hvdps-compare: run Horovod and parameter servers on one config and report side by side.

    hvdps-compare --workers 1,2 --backends horovod,ps --out runs/compare [trainer flags]
    hvdps-compare --from runs/compare              # rebuild the report, no training
    hvdps-compare --dry-run --workers 1,2,4         # print the exact commands

    hvdps-compare --project ...                     # the scaling projection (hvdps-project)

Every run goes through the real launcher (mpirun, python -m ps_train.launch;
hvdps/launchers.py)
with identical trainer flags, so model, data, seed, per-worker batch, global
batch, learning-rate rule and samples seen are the same; only the distribution
differs. A failed run is recorded with its error and the others still run.
"""
import json
import os
import shlex
import signal
import subprocess
import sys
import time

from common.config import argv_of, build_parser, check_finite, from_args
from common.errors import UsageError, cli
from common.metrics import read_records
from common.procs import REPO, child_env
from hvdps.launchers import get_launcher, parse_variants
from hvdps.report import RUN_RECORD, collect, environment_of, runs_from_dirs, write_report


def parse_workers(text):
    try:
        counts = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"--workers expects numbers like 1,2,4, got {text!r}")
    if not counts or counts[0] < 1:
        raise UsageError(f"--workers expects positive numbers, got {text!r}")
    return counts


def plan_runs(args, trainer_args, cores):
    runs = []
    for backend, mode in parse_variants(args.backends):
        launcher = get_launcher(backend)
        servers = launcher.server_tasks(args.num_ps)
        for n in parse_workers(args.workers):
            name = f"{backend}-{mode}-w{n}" + (f"-ps{args.num_ps}" if servers else "")
            run_dir = os.path.join(args.out, "runs", name)
            cmd = launcher.command(n, [*trainer_args, "--train_dir", run_dir], mode=mode, num_ps=args.num_ps)
            procs = n + servers
            runs.append({"name": name, "backend": backend, "mode": mode, "workers": n, "run_dir": run_dir,
                         "cmd": cmd, "env": launcher.env(), "oversubscribed": procs > cores})
    return runs


def _last_error(log_path):
    try:
        lines = open(log_path, errors="replace").read().splitlines()
    except OSError:
        return None
    errors = [l[l.index("error:"):] for l in lines if "error:" in l]
    return errors[-1] if errors else (lines[-1][-300:] if lines else None)


def execute(runs, timeout, progress=True):
    """Run each job in turn; a failure is recorded, never fatal."""
    from tqdm import tqdm
    env, repo = child_env(), REPO
    bar = tqdm(runs, desc="runs", unit="run", disable=None if progress else True,  # None: off when not a TTY
               dynamic_ncols=True)
    for run in bar:
        bar.set_postfix_str(run["name"])
        os.makedirs(os.path.dirname(run["run_dir"]), exist_ok=True)
        if os.path.exists(os.path.join(run["run_dir"], "metrics.jsonl")):
            raise UsageError(f"{run['run_dir']} already holds a run; choose another --out")
        log_path = run["run_dir"] + ".log"
        started, launched_at = time.monotonic(), time.time()
        with open(log_path, "w") as log:
            p = subprocess.Popen(run["cmd"], stdout=log, stderr=subprocess.STDOUT, env={**env, **run["env"]}, cwd=repo,
                                 start_new_session=True)
            code = _wait(p, run, timeout, bar)
        run.update(returncode=code, seconds=time.monotonic() - started, launched_at=launched_at, log=log_path)
        if os.path.isdir(run["run_dir"]):     # so a report rebuilt with --from still knows the start-up cost
            with open(os.path.join(run["run_dir"], RUN_RECORD), "w") as f:
                json.dump({"seconds": run["seconds"], "launched_at": launched_at, "exit_code": code,
                           "command": run["cmd"]}, f, indent=2)
        if code != 0:
            run["error"] = _last_error(log_path) or f"exit code {code}"
            bar.write(f"{run['name']}: FAILED ({run['error']})")
        else:
            bar.write(f"{run['name']}: ok in {run['seconds']:.0f}s")
    bar.close()
    return runs


def _wait(p, run, timeout, bar):
    """Wait for one job, showing its progress from the metrics file as it grows."""
    deadline = time.monotonic() + timeout
    metrics = os.path.join(run["run_dir"], "metrics.jsonl")
    while True:
        try:
            return p.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
        if os.path.exists(metrics):
            recs = read_records(metrics)
            head = next((r for r in recs if r["type"] == "header"), None)
            last = next((r for r in reversed(recs) if r["type"] == "step"), None)
            if head and last:
                bar.set_postfix_str(f"{run['name']} step {last['global_step']}/{(head.get('plan') or {}).get('total_updates')}")
        if time.monotonic() > deadline:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            return 124


def make_parser():
    p = build_parser(__doc__.splitlines()[0], prog="hvdps-compare")
    g = p.add_argument_group("comparison")
    g.add_argument("--workers", default="1,2", help="worker counts, e.g. 1,2,4")
    g.add_argument("--backends", default="horovod,ps", help="horovod, mpi (bare mpi4py Allreduce, the reference for Horovod), ps (both modes), ps:async, "
                        "ps:sync, ps2 (TF2's ParameterServerStrategy)")
    g.add_argument("--num_ps", type=int, default=1, help="parameter-server tasks for PS runs")
    g.add_argument("--run_timeout", type=float, default=900, help="seconds before a run is stopped")
    g.add_argument("--dry-run", dest="dry_run", action="store_true", help="print the commands, run nothing")
    g.add_argument("--from", dest="from_dirs", nargs="+", default=None,
                   help="rebuild the report from existing run directories")
    g.add_argument("--no-progress", dest="progress", action="store_false")
    g.add_argument("--project", action="store_true",
                   help="run the scaling projection instead (same as hvdps-project; see its --help)")
    p.set_defaults(train_dir="runs/compare")
    return p


COMPARE_FLAGS = ("workers", "backends", "num_ps", "run_timeout", "dry_run", "from_dirs", "progress", "project",
                 "train_dir", "resume")


def absolute_paths(args):
    """Paths the user gave relative to their folder, made absolute for runs that start elsewhere."""
    args.train_dir = os.path.abspath(args.train_dir)
    if args.data_dir:
        args.data_dir = os.path.abspath(args.data_dir)
    for flag in ("model", "dataset"):
        target, sep, attr = getattr(args, flag).rpartition(":")
        if sep and (target.endswith(".py") or os.sep in target):
            setattr(args, flag, f"{os.path.abspath(target)}:{attr}")


@cli
def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--project" in argv:          # a sub-command with its own flags, not a training option
        from hvdps import projection
        return projection.main([a for a in argv if a != "--project"])
    parser = make_parser()
    args = parser.parse_args(argv)
    absolute_paths(args)             # every run starts in the repository, not in the user's folder
    cfg = from_args(args)
    args.out = cfg.train_dir
    if args.num_ps < 1:
        raise UsageError("--num_ps must be at least 1")
    check_finite("run_timeout", args.run_timeout)
    if args.run_timeout <= 0:
        raise UsageError(f"--run_timeout must be positive, got {args.run_timeout}")
    if args.from_dirs:
        runs = runs_from_dirs(args.from_dirs)
    else:
        trainer_args = argv_of(args, parser, skip=COMPARE_FLAGS)
        runs = plan_runs(args, trainer_args, os.cpu_count() or 1)
        if args.dry_run:
            for run in runs:
                print(shlex.join(run["cmd"]))
            return 0
        if os.path.exists(os.path.join(args.out, "report.md")):
            raise UsageError(f"--out {args.out} already holds a report; choose another directory "
                             f"or rebuild it with --from {args.out}")
        execute(runs, args.run_timeout, progress=args.progress)
    rows = collect(runs)
    configs = cfg.to_dict()
    if args.from_dirs:                  # the runs' own configs, one per workload, not this command's defaults
        configs = {r.get("model") or r["run_dir"]: (r["_curves"].get("header") or {}).get("config")
                   for r in rows if r.get("_curves")}
    table = write_report(rows, args.out, configs, environment_of(rows))
    print(table)
    print(f"\nreport: {os.path.join(args.out, 'report.md')}")
    return 0 if all(r.get("status") == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
