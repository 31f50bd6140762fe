"""hvdps tune: search each method's own settings, find its best through its real launcher, and compare the methods best against best.

    hvdps tune --workers 2 --model mlp --backends horovod,mpi,mwms,ps --budget 900 --out runs/tune
    hvdps tune --backends 'NAME[SETTING=V1|V2],ps:async|sync' ...   # a narrower space
    hvdps tune --resume --out runs/tune             # a killed tune, on from its last finished trial
    hvdps tune --from runs/tune --out runs/tune2    # the report again, no training
    hvdps tune --from runs/tune --out runs/tune64 --for_workers 64 --bandwidth_gbps 25 --latency_us 10
                                                    # ... ranked for that cluster by replaying its finals
    hvdps tune --dry_run ...                        # the space and the probes' commands

Each method's defaults run first at full length (the probe: its compute, its exchange, its time to
accuracy); its cost model ranks the candidates of its space (``Method.space``) from that probe and
prunes those it predicts to be far worse; successive halving runs the rest for --trial_steps steps,
keeps the best third of each kind, and runs those three times longer; each method's finalists and
its defaults then run at full length --repeat times in alternating order. A setting that changes the
arithmetic (async, backup workers, local SGD's k, fp16 gradients) is judged by time to the target
accuracy, the others by throughput with the accuracy held. Every trial is a comparison's run (its
command, settings and metrics in its folder), under the cluster the flags ask for (--hosts, hvdps
emulate, --straggler or --slow_link), within --budget seconds.
"""
import argparse
import copy
import os
import shlex
import signal
import sys

from common.base.errors import UsageError, cli
from common.base.files import take_folder, write_atomic
from common.base.flags import check_finite
from common.formats.schemas import TuneRecord, read_tune_record
from common.spec.config import argv_of, build_parser, from_args
from common.spec.plugins import plugins_bounded
from hvdps.commands import compare
from hvdps.measure import conditions
from hvdps.measure.identity import RunId, workload_name
from hvdps.measure.cgroups import CpuController
from hvdps.measure.jobs import Interrupted, own_signals
from hvdps.methods import METHODS, add_task_flags, get_launcher, task_flag_dests, tuning as methods_tuning
from hvdps.render.tune import write_tune_report
from hvdps.tune import best, scale, space
from hvdps.tune.trials import Clock, Trials, say
from hvdps.tune.tuner import tune

STATE = "tune.json"
MIN_BUDGET_S = 60
TUNE_FLAGS = (*task_flag_dests(), "workers", "backends", "budget", "trial_steps", "repeat", "run_timeout", "dry_run",
              "from_dir", "progress", "train_dir", "resume", "hosts", "rsh", "network_interface", "ps_placement", "port",
              "links", "straggler", "stall", "slow_link", "image", "for_workers", "bandwidth_gbps", "latency_us")
RESUMABLE = ("--resume", "--out", "--train_dir", "--budget", "--no_progress")


def spaces_help():
    return "; ".join(f"{m.name}: " + (", ".join(f"{a.name} {'|'.join(a.values)}" for a in m.space) or "its defaults")
                     for m in METHODS.values())


def make_parser():
    p = build_parser(__doc__.splitlines()[0], prog="hvdps tune")
    g = p.add_argument_group("tune")
    g.add_argument("--workers", default="2", help="the one worker count every trial runs at")
    g.add_argument("--backends", default="horovod,mpi,mwms,ps",
                   help="methods to tune, NAME[:MODE|MODE][AXIS=V|V,...] narrowing the space searched (quote the "
                        "brackets in a shell); each searches its own axes, the default first: " + spaces_help())
    add_task_flags(g)
    g.add_argument("--budget", type=float, default=900, help="seconds of wall time the whole tune may take")
    g.add_argument("--trial_steps", type=int, default=300,
                   help="steps of halving's first, shortest trials (the next rung runs three times as many)")
    g.add_argument("--repeat", type=int, default=2,
                   help="full-length runs of each finalist and of each method's defaults, in alternating order")
    g.add_argument("--run_timeout", type=float, default=900, help="seconds before one trial is stopped")
    g.add_argument("--image", default="registry.example.com/hvdps:v1",
                   help="the image best/'s Kubernetes manifests name (push hostfiles/k8s/Dockerfile's build there)")
    g.add_argument("--for_workers", type=int, default=None,
                   help="the worker count of the cluster the tune is for: each method's finals replayed there "
                        "(with --bandwidth_gbps and --latency_us), ranked by projected throughput, best/ for it")
    g.add_argument("--bandwidth_gbps", type=float, default=None, help="--for_workers: its links' bandwidth, Gbit/s")
    g.add_argument("--latency_us", type=float, default=None, help="--for_workers: its links' latency, microseconds")
    g.add_argument("--dry_run", action="store_true", help="print the space and the probes' commands, run nothing")
    g.add_argument("--from", dest="from_dir", default=None, help="rebuild the report of the tune in this folder")
    g.add_argument("--no_progress", dest="progress", action="store_false")
    compare.add_cluster_flags(p, "every trial on it; as root")
    p.set_defaults(train_dir="runs/tune")
    p.bound("run_timeout", positive=True)
    p.bound("repeat", 1, 20)
    p.bound("trial_steps", 10, 10 ** 6)
    p.bound("for_workers", 2, 65536)
    p.bound("bandwidth_gbps", 1e-6, 1e6)
    p.bound("latency_us", 1e-3, 1e9)
    return p


def resumed_argv(argv):
    """--resume: the tune's own flags from its folder's tune.json, with this call's --budget."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--out", "--train_dir", "--train-dir", dest="out", default="runs/tune")
    p.add_argument("--budget", default=None)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--no_progress", action="store_true")
    known, rest = p.parse_known_args(argv)
    if rest:
        raise UsageError(f"--resume takes the tune's flags from {os.path.join(known.out, STATE)}; give only "
                         f"{', '.join(RESUMABLE[:2])}, --budget and --no_progress (got {' '.join(rest)})")
    stored = read_state(known.out, "--resume")
    extra = (["--budget", known.budget] if known.budget else []) + (["--no_progress"] if known.no_progress else [])
    return stored + extra + ["--out", known.out]


def read_state(folder, flag):
    """The tune's own flags from its folder's tune.json (common/formats/schemas.py: TuneRecord)."""
    path = os.path.join(folder, STATE)
    if not os.path.lexists(path):
        raise UsageError(f"{flag} {folder}: no tune there ({STATE} missing)")
    return list(read_tune_record(path).argv)


@cli
def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    resuming = "--resume" in argv
    if resuming:
        argv = resumed_argv(argv)
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.from_dir:                     # the tune's own flags, from its folder; the report into --out
        source = os.path.abspath(args.from_dir)
        gave_out = any(a.split("=")[0] in ("--out", "--train_dir", "--train-dir") for a in argv)
        target = [a for flag in ("for_workers", "bandwidth_gbps", "latency_us") if getattr(args, flag) is not None
                  for a in (f"--{flag}", str(getattr(args, flag)))]       # this call's cluster, not the tune's
        args = parser.parse_args(read_state(source, "--from") + target +
                                 ["--out", args.train_dir if gave_out else source])
        args.from_dir = source
    compare.absolute_paths(args)
    with plugins_bounded(args.run_timeout, "--run_timeout"):
        return run(args, parser, argv, resuming)


def validate(args, cfg):
    """Every refusal before --out is taken: the space, the worker count, the budget, the cluster, and
    everything a comparison of the space's candidates would refuse (hvdps/commands/compare.py: validate)."""
    workers = compare.parse_workers(args.workers)
    target_of(args)
    if len(workers) != 1:
        raise UsageError(f"--workers {args.workers}: hvdps tune tunes at one worker count")
    check_finite("budget", args.budget)
    if args.budget < MIN_BUDGET_S:
        raise UsageError(f"--budget {args.budget:g}: at least {MIN_BUDGET_S} s, a probe of each method at full length")
    # a candidate its trainer would refuse at this worker count (K backup workers of K) is no candidate
    spaces = {name: space.precision_candidates([c for c in space.candidates(name, axes, args) if runs_at(c, workers[0])],
                                               args.precision)
              for name, axes in space.parse_space(args.backends).items()}
    found = compare.cluster_conditions(args)
    if len(found) > 2:
        raise UsageError("hvdps tune tunes for one cluster: one --straggler factor, --stall or --slow_link")
    shim = copy.copy(args)
    shim.backends = ",".join(dict.fromkeys(c.entry for cs in spaces.values() for c in cs))   # precisions share one
    shim.resume, shim.from_dirs, shim.repeat = False, [args.from_dir] if args.from_dir else None, 1
    asked = compare.validate(shim, cfg)
    return spaces, workers[0], (found[1] if len(found) > 1 else None), asked, shim


def target_of(args):
    """The cluster --for_workers names (hvdps/tune/scale.py: Target), or None: all three flags or none."""
    given = [args.for_workers, args.bandwidth_gbps, args.latency_us]
    if all(g is None for g in given):
        return None
    if any(g is None for g in given):
        raise UsageError("--for_workers, --bandwidth_gbps and --latency_us name the cluster together: give all three")
    for name in ("bandwidth_gbps", "latency_us"):
        check_finite(name, getattr(args, name))
    return scale.Target(args.for_workers, args.bandwidth_gbps, args.latency_us)


def workload_of(args):
    """(precision or None) -> the workload's name: a candidate's own policy, else the flags' (--precision auto
    resolved on this machine)."""
    return lambda precision=None: workload_name(args.model, precision or args.precision, args.jit_compile)


def runs_at(candidate, workers):
    """Whether ``candidate``'s job at ``workers`` workers is one its trainer starts (Launcher.check_job)."""
    v = candidate.variant
    try:
        get_launcher(v.method).check_job(RunId("", v.method, v.mode, workers, tuple(v.tasks or ())))
    except UsageError:
        return False
    return True


def run(args, parser, argv, resuming):
    cfg = from_args(args)
    args.out = cfg.train_dir
    spaces, workers, condition, asked, shim = validate(args, cfg)
    trainer_args = argv_of(args, parser, skip=TUNE_FLAGS)
    if args.dry_run:
        return dry_run(spaces, workers, condition, trainer_args, args)
    remote = compare.make_remote(args)
    links = compare.load_links(args.links) if args.links else None
    trials = Trials(args.from_dir or args.out, workload_of(args), workers, trainer_args, condition, remote, links,
                    run_timeout=args.run_timeout, clock=Clock(args.budget), live=not args.from_dir,
                    progress=Progress() if args.progress else None)
    if not args.from_dir:
        compare.check_plan(shim, asked, remote, links)
        for cands in spaces.values():          # what a trial would refuse at start (its tasks on the hosts)
            for c in cands:
                trials.plan(c, "probe")
        claim(args, argv, resuming)
        if remote:
            compare.check_hosts(remote.hosts, remote.agent, args.out)
    controller, previous = None, own_signals()
    try:
        if isinstance(condition, conditions.Straggler) and not args.from_dir:
            controller = CpuController.find()
            controller.remove_stale()
            trials.controller = controller
        tuned = tune(spaces, trials, args.trial_steps, args.repeat)
    except Interrupted as exc:
        say(f"error: {exc.name}: the tune stopped after {trials.count} trial(s); continue it with "
            f"hvdps tune --resume --out {args.out}")
        return 128 + exc.signum
    finally:
        if controller:
            controller.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    target = target_of(args)
    at = scale.rank(tuned, target, methods_tuning()) if target else None
    text = write_tune_report(tuned, args.out, args, trainer_args, workers,
                             extra=scale.section(at, target) if at else ())
    if at:
        best.write_best(scale.retuned(tuned, at), args.out, args, trainer_args, target.workers)
    else:
        best.write_best(tuned, args.out, args, trainer_args, workers)
    print(text)
    print(f"\nreport: {os.path.join(args.out, 'report.md')}")
    return 0 if all(m.failed is None for m in tuned.methods) else 1


def claim(args, argv, resuming):
    """--out for this tune: a new folder (its command line recorded in tune.json), or with --resume the
    tune already there."""
    state = os.path.join(args.out, STATE)
    if resuming:
        take_folder(args.out, "--out")
        return
    if os.path.lexists(state):
        raise UsageError(f"--out {args.out} already holds a tune; continue it with hvdps tune --resume --out "
                         f"{args.out}, or choose another --out")
    compare.check_out(args.out, None)
    take_folder(args.out, "--out")
    own = [a for a in argv if a not in ("--no_progress",)]
    write_atomic(state, TuneRecord(argv=without_out(own)).model_dump_json(indent=2))


def without_out(argv):
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--out", "--train_dir", "--train-dir", "--budget"):
            skip = True
        elif not a.startswith(("--out=", "--train_dir=", "--train-dir=", "--budget=")):
            out.append(a)
    return out


def dry_run(spaces, workers, condition, trainer_args, args):
    """The space each method searches, and its probe's exact line."""
    print(compare.dry_run_preamble())
    trials = Trials(args.out, workload_of(args), workers, trainer_args, condition, compare.make_remote(args))
    for name, cands in spaces.items():
        print(f"# {name}: {len(cands)} candidate(s): " + ", ".join(c.entry + (f" --precision {c.precision}" if c.precision else "") for c in cands))
        planned = trials.plan(cands[0], "probe")
        print(shlex.join(planned.cmd))
    return 0


class Progress:
    """The line after each trial: what ran, its figure, trials done, each method's best so far, time left."""

    def __init__(self):
        self.best, self.done = {}, 0

    def __call__(self, candidate, stage, row, clock=None):
        self.done += 1
        rate = row.samples_per_sec_median if row.status == "ok" else None
        if rate and rate > self.best.get(candidate.method, (0, ""))[0]:
            self.best[candidate.method] = (rate, candidate.label)
        said = f"{rate:,.0f} samples/s" if rate else f"FAILED ({row.error or row.status})"
        best = "; ".join(f"{label} {r:,.0f}" for r, label in self.best.values())
        left = f", {clock.left():.0f} s left" if clock else ""
        say(f"tune: trial {self.done} [{stage}] {candidate.entry}: {said} | best so far: {best}{left}")


if __name__ == "__main__":
    sys.exit(main())
