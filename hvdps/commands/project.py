"""hvdps project: scaling efficiency projected past this machine, from runs or described hardware.

The command line of the projection (hvdps/cost/projection.py): it reads the inputs (hvdps runs, a
measured comm.json, an emulated cluster's links, flags), picks the network each method is costed
with, and writes projection.md/json/png (hvdps/render/projection.py).
"""
import dataclasses
import os
import sys

from common.base.errors import UsageError, cli
from common.base.files import make_dirs, write_atomic
from common.base.procs import REPO
from common.formats.schemas import read_cluster_description, read_comm
from hvdps import methods
from hvdps.cost import crossover, heldout, replay, stragglers
from hvdps.cost.schedule import AlphaBeta, Unfitted
from hvdps.measure.rows import kept_rates, load_run, measured_interval
from hvdps.measure.identity import settings_text
from hvdps.measure.runs import identity_of, load_of, model_layers_of, run_record
from hvdps.cost.projection import (Checked, TCP_GOODPUT, fit_from_comm, known_models, measured_overlap, powers_of_two,
                                   project, projected_step, run_exchange_s, single_layer)
from hvdps.render import crossover as crossover_render, heldout as heldout_render
from hvdps.measure.conditions import parse_stragglers
from hvdps.render.projection import _size, check_table, dumps, plot, replay_table, table
from hvdps.render.report import contention_words
from hvdps.measure.links import run_cores
from hvdps.measure.timeline import rank_files, run_readies, worker_index
from common.base.flags import Parser, check_finite
from common.spec.plugins import plugins_bounded


def find_runs(path, unhealthy=False):
    """Run directories under ``path`` (itself, or its sub-directories) that have metrics; those with
    a slow or stalled worker (hvdps compare --straggler, --stall) only with ``unhealthy``: the
    projection's fits and checks model a healthy cluster."""
    if os.path.exists(os.path.join(path, "metrics.jsonl")):
        found = [path]
    else:
        found = sorted(root for root, _dirs, files in os.walk(path) if "metrics.jsonl" in files)
    return [d for d in found if unhealthy or not unhealthy_of(d)]


def unhealthy_of(run_dir):
    """What a comparison did to the run's worker (common/formats/schemas.py: Unhealthy), or None."""
    record = run_record(run_dir)
    return record.unhealthy if record else None


@dataclasses.dataclass(frozen=True)
class Found:
    """One run under --from, read once: its row (its own records), its comparison's record, and the
    machine's cores it kept busy (hvdps/measure/links.py: run_cores)."""
    row: object
    record: object
    busy: object
    cores: object

    @property
    def unhealthy(self):
        return self.record.unhealthy if self.record else None


def load_found(path):
    """[Found] of every run under ``path``, each read from disk once for every part of the projection."""
    out = []
    for d in find_runs(path, unhealthy=True):
        row, record = load_run(d), run_record(d)
        row = dataclasses.replace(row, identity=identity_of(row, record))   # its settings and repeat
        busy, cores = run_cores(d, row.header, row.curves.steps)
        out.append(Found(row, record, busy, cores))
    return out


def healthy_of(found):
    """The runs the projection's fits and checks take: a healthy cluster's (no slow or stalled worker)."""
    return [f for f in found if f.unhealthy is None]


def from_runs(found, path, nets):
    """compute_s, layers, per-backend measured overlaps, notes and the (backend, mode) of every timed
    run, from the healthy runs ``found`` under ``path``."""
    rows = [f.row for f in healthy_of(found)]
    if not rows:
        raise UsageError(f"--from {path}: no hvdps runs there (no metrics.jsonl)")
    timed = [r for r in rows if r.compute_s]
    if not timed:
        raise UsageError(f"--from {path}: no run has a per-step breakdown (rerun with --probe_steps > 0)")
    # a 1-worker run's probe ran with the machine to itself; with more ranks on few cores the others'
    # polling competes with it, so prefer the single-worker figures when there are any
    alone = [r for r in timed if (r.workers or 1) == 1] or timed
    computes = sorted(r.compute_s for r in alone)
    compute = computes[len(computes) // 2]
    try:
        layers = model_layers_of(timed[0].run_dir)
    except Exception as exc:         # a plug-in that no longer imports: fall back to the size alone
        print(f"note: could not rebuild the run's model ({exc}); treating its gradient as one tensor",
              file=sys.stderr)
        if not timed[0].grad_bytes_per_step:
            raise UsageError(f"--from {path}: cannot rebuild the run's model ({exc}) and "
                             f"{timed[0].name} recorded no gradient size to stand for it")
        layers = single_layer(timed[0].grad_bytes_per_step)
    measured, notes = {}, []
    # one measured overlap per method and mode, from its largest run (most workers, then most other tasks):
    # a folder of 48 runs would otherwise add 48 lines to the table and the plot
    largest = {}
    for r in timed:
        key = (r.backend, r.mode, r.settings)
        size = (r.workers or 1, sum(n for _, n in r.tasks))
        if key not in largest or size >= (largest[key].workers or 1, sum(n for _, n in largest[key].tasks)):
            largest[key] = r
    for r in largest.values():
        method = r.method
        if method is None or method.cost.collective and ((r.workers or 1) < 2 or not method.cost.exact):
            continue                 # an inexact ring (local SGD) has rows of its own, by its k (own_rows)
        t, how = run_exchange_s(r, nets)
        ov = measured_overlap(r, t)
        if ov is None:
            continue
        label = method.cost.arch + f" (overlap of {r.backend}"
        label += f" {r.mode or ''}{' [' + settings_text(r.settings) + ']' if r.settings else ''} x{r.workers}: {ov:.0%})".replace("  ", " ")
        measured[label] = (ov, method.cost)
        notes.append(f"{r.name}: compute {1e3 * r.compute_s:.2f} ms, step "
                     f"{1e3 * r.step_s:.2f} ms, exchange {1e3 * t:.2f} ms ({how}) -> overlap {ov:.0%}")
    return compute, layers, measured, notes, [(r.backend, r.mode, r.settings) for r in timed]


def costed_settings(method, settings):
    """The part of a run's ``settings`` its method's cost model takes (an ``Option`` of that name)."""
    flags = {o.flag for o in method.cost.options}
    return tuple((name, value) for name, value in settings if name in flags)


def own_rows(nets, ring, variants=()):
    """{label: (method, fit, mode, settings)}: the collective methods the projection draws on rows of
    their own: those with a network fit of their own (TensorFlow's ring) and those whose step is not the
    exact ring's (local SGD), each in the modes the runs measured (``variants``: (backend, mode,
    settings) each), else its first; and each run measured at settings its cost model takes (Horovod's
    cycle time), projected at those settings beside the defaults' generic rows."""
    out = {}
    for method in methods.METHODS.values():
        if not method.cost.collective:
            continue
        net = nets.get(method.cost.network)
        ran = [(m, costed_settings(method, st)) for b, m, st in variants if b == method.name]
        if method.cost.exact and net in (None, ring):
            ran = [(m, st) for m, st in ran if st]
        elif not ran:
            ran = [(method.modes[0], ())]
        for mode, settings in dict.fromkeys(ran):
            out[methods.label(method.name, mode, settings)] = (method, net or ring, mode, settings)
    return out


# What a projection input may be: from a 1 kbit/s link to a 1 Pbit/s one, and so on. Outside
# these the arithmetic overflows or underflows into infinities and zeros, not an answer.
INPUT_RANGES = {"bandwidth_gbps": (1e-6, 1e6), "latency_us": (1e-3, 1e9),
                "step_compute_ms": (1e-6, 1e9), "model_params": (1, 1e13)}


MAX_WORKERS = 65536


def cluster_of(path):
    """The emulated cluster's description (hvdps emulate's cluster.json) in ``path`` or up to two
    folders above it (a compare folder, its runs/, one run), or None."""
    here = os.path.abspath(path)
    for _ in range(3):
        candidate = os.path.join(here, "cluster.json")
        if os.path.lexists(candidate):
            desc = read_cluster_description(candidate)
            if desc.rate_bps:
                return desc
        here = os.path.dirname(here)
    return None


def check_runs(found, layers, nets, tuning):
    """(a row per multi-worker run under ``path``: measured step time beside the projected one,
    [(run, why)] of the runs left out: shared or oversubscribed, what they measured was contention
    for the cores, not the method the model projects). A run with a slow or stalled worker or a
    slow link is in neither: it is held to its healthy twin (``unhealthy_check``)."""
    rows, left_out = [], []
    for f in healthy_of(found):
        row, record = f.row, f.record
        if (row.workers or 1) < 2 or not row.step_s or not row.compute_s:
            continue
        row = dataclasses.replace(row, load=load_of(row))
        if row.load.shared:
            left_out.append((row.name, f"shared: {contention_words(row)}"))
            continue
        if record and record.oversubscribed:
            left_out.append((row.name, "oversubscribed: more processes than cores"))
            continue
        projected, how = projected_step(row, row.shard_bytes, layers, nets, tuning)
        if projected is None:
            continue
        rows.append(Checked(run=row.name, backend=row.backend, mode=row.mode, workers=row.workers,
                            tasks=row.tasks, how=how, measured_step_s=row.step_s, projected_step_s=projected,
                            ratio=row.step_s / projected))
    return rows, left_out


def heldout_of(found, layers, nets, tuning):
    """(hvdps/cost/heldout.py's entries for the healthy runs ``found``, the cores they shared or None)."""
    rows = [dataclasses.replace(f.row, cores_busy=f.busy) for f in healthy_of(found)]
    shared = {f.cores for f in healthy_of(found) if f.cores}
    cores = max(shared) if shared else None
    def terms_of(row):
        method = row.method
        return method.cost.step_terms(row, row.shard_bytes, layers, nets, methods.tuning_at(row, tuning))

    entries = heldout.analyse(rows, terms_of, cores)
    return entries, cores


def replay_of(found, layers, nets, tuning):
    """hvdps/cost/replay.py's runs of the healthy runs ``found``, each its workers' logged steps."""
    return replay.runs_of([f.row for f in healthy_of(found)], layers, nets, tuning, run_readies)


def replayed_of(args, inp, tuning, held):
    """(the replay's held-out entries, the projector trusted per method, each method replayed at the
    projection's worker counts, their sections of projection.md) of the runs under --from."""
    runs = replay_of(inp.found, inp.layers, inp.nets, tuning) if args.from_dir else []
    entries, cores = replay.analyse(runs, held[1]), held[1]
    scaled = replay.at_scale(runs, powers_of_two(1, args.max_workers), cores)
    trusted = heldout_render.trusted(entries, held[0], [r.method for r in scaled])
    text = "\n".join(heldout_render.replay_section(entries, held[0])) + "\n" if entries else ""
    return entries, trusted, scaled, text + replay_table(scaled, trusted)


def slow_links(cluster, healthy):
    """What differs in ``cluster``'s links from the ``healthy`` one's: "h2 at 10 Mbit/s" (None: nothing)."""
    if not cluster or not healthy:
        return None
    rates = cluster.rates or {}
    slow = [(h, bps) for h, bps in rates.items()
            if bps != (healthy.rates or {}).get(h, healthy.rate_bps)]
    names = cluster.ports or {}
    return ", ".join(f"{names.get(h, h)}'s link at {bps / 1e6:g} Mbit/s" for h, bps in slow) or None


def cpu_per_step(run_dir):
    """{worker index: its process's CPU seconds a step} from the run's ranks/<task>.json (TF2's PS
    workers, timed at the coordinator, give none)."""
    out = {}
    for task, rank in rank_files(run_dir).items():
        if worker_index(task) is not None and rank.cpu_s_per_step:
            out[worker_index(task)] = rank.cpu_s_per_step
    return out


def runs_by_identity(found):
    """{identity: (row, what was done to it, its cores)} of the runs ``found``: a run's healthy twin is
    the run of its identity with no condition, the repeat kept; on a cluster built with a slow link,
    where no run has a condition, its namesake on the cluster without it."""
    out = {}
    for f in found:
        unhealthy = f.unhealthy
        row = dataclasses.replace(f.row, roles=(f.record.roles if f.record else None),
                                  condition=unhealthy.condition if unhealthy else None)
        row = dataclasses.replace(row, identity=identity_of(row, f.record))
        out[row.identity or row.name] = (row, unhealthy, f.cores)
    return out


def unhealthy_check(found, path, healthy_path, layers, tuning):
    """(hvdps/cost/stragglers.py's ``Held`` per run under ``path`` on an unhealthy emulated cluster,
    [(run, why)] left out): a run with a slow or stalled worker, or a slow link (--slow_link), against
    its healthy twin in the same comparison, and with ``healthy_path`` (the same comparison on the cluster without ``--link``)
    every run on a cluster with a slow link against its namesake there. Each is predicted from its
    twin's measured throughput and the model's steps on both clusters, so nothing measured on the
    unhealthy cluster goes into its own prediction. With --repeat the twin is the healthy run of the
    same repeat, not the shape's median repeat: it ran a few runs from the run in the alternating
    order, and its samples/s and CPU a step carry what the machine was doing then (held this way, the
    slow-worker runs of BENCHMARKS.md section 18 are a mean 6.5% from their prediction)."""
    cluster = cluster_of(path)
    if cluster is None or cluster.latency_s is None:
        return [], []
    base_cluster = cluster_of(healthy_path) if healthy_path else cluster
    if healthy_path and (base_cluster is None or base_cluster.latency_s is None):
        raise UsageError(f"--healthy {healthy_path}: no emulated cluster there (hvdps emulate's cluster.json)")
    linked = slow_links(cluster, base_cluster) if healthy_path else None

    runs = runs_by_identity(found)
    twins = runs_by_identity(load_found(healthy_path)) if healthy_path else \
        {n: v for n, v in runs.items() if v[1] is None}
    found, left_out = [], []
    for row, unhealthy, cores in runs.values():
        name = row.name
        if unhealthy is None and not linked or (row.workers or 1) < 2 or row.method is None:
            continue
        twin = twins.get(row.identity.healthy) if row.identity else None
        if twin is None or twin[1] is not None or not twin[0].compute_s:
            left_out.append((name, "no healthy run of the same shape with a per-step breakdown"))
            continue
        healthy = twin[0]
        compute = heldout.contended_compute(healthy, cores)
        paces = stragglers.paces_of(unhealthy, row.workers, healthy.compute_s, compute,
                                    measured_interval(row.curves.header, row.curves.steps),
                                    cpu_s=cpu_per_step(healthy.run_dir))
        what = ", ".join(x for x in (unhealthy.what if unhealthy else None, linked) if x)

        def nets_of(c, r):
            return stragglers.link_networks(c.latency_s, c.rates, r.roles, c.rate_bps, TCP_GOODPUT,
                                            r.method.cost)

        own = cluster
        if unhealthy is not None and unhealthy.rate_bps:       # a slow link, run by run (--slow_link)
            own = cluster.model_copy(update={"rates": {**(cluster.rates or {}), unhealthy.host: unhealthy.rate_bps}})
        entry = stragglers.held(row, healthy, what, paces, compute, nets_of(base_cluster, healthy),
                                nets_of(own, row), layers, tuning,
                                kept=kept_rates(row, healthy, stalled=bool(unhealthy and unhealthy.stalled)))
        if entry is None:
            left_out.append((name, "no throughput measured, or no step model for its method"))
        else:
            found.append(entry)
    return found, left_out


# ---------------------------------------------------------------- command line
def make_parser():
    p = Parser(prog="hvdps project", description="Project scaling efficiency to many workers "
               "(alpha-beta network, wait-free backprop schedule; no training)")
    p.add_argument("--from", dest="from_dir", default=None,
                   help="hvdps runs (a compare directory or one run): compute time, gradient, the model's "
                        "layers and the overlap each run achieved are taken from them")
    p.add_argument("--run_timeout", type=float, default=60,
                   help="--from: seconds the runs' model plug-ins may take to import and build, all together (a "
                        "plug-in that never returns is named, and its gradient taken as one tensor; a recorded "
                        "model builds in seconds)")
    p.add_argument("--comm_json", dest="comm_json", default=None,
                   help="measured latency/bandwidth (benchmarks/results/comm.json) to fit the model from")
    p.add_argument("--bandwidth_gbps", dest="bandwidth_gbps", type=float, default=None,
                   help="achievable link bandwidth in Gbit/s (overrides the measured fit)")
    p.add_argument("--latency_us", dest="latency_us", type=float, default=None, help="per-message latency")
    p.add_argument("--step_compute_ms", dest="step_compute_ms", type=float, default=None,
                   help="compute time of one step on one worker")
    p.add_argument("--model_params", dest="model_params", type=float, default=None,
                   help="parameters (millions) of a model known only by size (no layers: nothing overlaps)")
    p.add_argument("--model_name", dest="model_name", default=None,
                   help="a model whose layers ship with hvdps: resnet50, resnet101, inception_v3, vgg16, "
                        "mobilenet_v2 (ImageNet shapes), gpt2_small (GPT-2 small: 1,024 tokens of a 50,257 "
                        "vocabulary)")
    p.add_argument("--gpus_per_server", dest="gpus_per_server", type=int, default=1)
    p.add_argument("--straggler_cv", dest="straggler_cv", type=float, default=0.03,
                   help="per-step coefficient of variation of a worker's compute; synchronous training "
                        "waits for the slowest of n every step (default 0.03)")
    p.add_argument("--straggler", default=None,
                   help="RANK:FACTOR[,RANK:FACTOR...]: worker RANK's compute FACTOR times slower than the "
                        "others' (as hvdps compare --straggler); a synchronous step waits for it (order "
                        "statistics with --straggler_cv)")
    p.add_argument("--healthy", dest="healthy_dir", default=None,
                   help="--from's runs on the cluster without its slow link (hvdps emulate without --link): "
                        "each run under --from is predicted from its namesake there")
    p.add_argument("--max_workers", dest="max_workers", type=int, default=512)
    g = p.add_argument_group("the methods' own knobs", "each declared by its method's cost model "
                             "(<method>_train/method.py), at that implementation's defaults")
    for option in methods.options():
        g.add_argument(f"--{option.flag}", type=option.type, default=option.default,
                       choices=option.choices or None, help=option.help)
        p.bound(option.flag, option.low, option.high)
    for name, (low, high) in INPUT_RANGES.items():
        p.bound(name, low, high)
    p.bound("straggler_cv", 0, 1)
    p.bound("gpus_per_server", 1, 1024)
    p.bound("run_timeout", positive=True)
    p.bound("max_workers", 1, MAX_WORKERS)
    p.add_argument("--out", default="runs/projection", help="where projection.md/json/png go")
    return p


def slowest_link_bps(cluster):
    """The emulated cluster's slowest link (hvdps emulate --link): a ring moves at its slowest link's
    pace, and the projection takes it for every link, PS included (where only the hosts behind it pay)."""
    return min([cluster.rate_bps, *(cluster.rates or {}).values()])


def networks(args, fits, source="--comm_json", cluster=None, tuning=None):
    """{network: alpha/B} for the cost models (``CostModel.net``). The projection's generic networks
    (the ring's and the servers', ``generic_networks``): given flags win over an emulated cluster's
    links (their rate at TCP's goodput, their measured latency), which win over the measured fit; a
    fit that could not be made is refused in one line when it would be used; a method's declared
    transport rate (``tuning``: an ``Option`` with a ``network``) caps its network's bandwidth. Then
    each family comm.json measured on its own (TensorFlow's ring, ``mwms``), unless flags or an
    emulated cluster's links give every method the same network."""
    nets = {key: fits.get(key) for key in generic_networks()}
    shared = bool(cluster and cluster.latency_s is not None) or args.bandwidth_gbps is not None or \
        args.latency_us is not None
    if cluster and cluster.latency_s is not None:
        link = AlphaBeta(bandwidth=slowest_link_bps(cluster) / 8 * TCP_GOODPUT, alpha=cluster.latency_s)
        nets = {key: link for key in nets}
    given = args.bandwidth_gbps is not None and args.latency_us is not None
    for fit in nets.values():
        if isinstance(fit, Unfitted) and not given:
            raise UsageError(f"--project: cannot fit latency and bandwidth from {source}: {fit.error}; "
                             f"give the network as --bandwidth_gbps and --latency_us")
    if args.bandwidth_gbps is not None or args.latency_us is not None:
        first = next(iter(nets.values()))    # a flag not given: the first panel's (the ring's) measured figure
        if (args.bandwidth_gbps is None or args.latency_us is None) and not first:
            raise UsageError("--project needs both --bandwidth_gbps and --latency_us, or a --comm_json")
        bw = args.bandwidth_gbps * 1e9 / 8 if args.bandwidth_gbps is not None else first.bandwidth
        lat = args.latency_us * 1e-6 if args.latency_us is not None else first.alpha
        nets = {key: AlphaBeta(bandwidth=bw, alpha=lat) for key in nets}
    tuning = tuning or methods.tuning()
    for option in methods.options():
        rate = getattr(tuning, option.field) if option.network else None
        if rate is not None and nets.get(option.network):
            nets[option.network] = dataclasses.replace(nets[option.network], bandwidth=rate)
    for key, fit in ({} if shared else fits).items():
        if key not in nets and not isinstance(fit, Unfitted):
            nets[key] = fit
    return nets


def generic_networks():
    """The networks of the projection's generic rows, each panel's cost model's (the ring's first)."""
    return tuple(dict.fromkeys(model.network for model in methods.schedulers()))


@dataclasses.dataclass(frozen=True)
class Inputs:
    """What a projection is made of, read once: the networks, the model's layers and compute, and
    what the runs measured (``--from``)."""
    nets: dict
    cluster: object
    comm_json: str
    layers: list
    compute: float
    measured: dict
    notes: list
    variants: list
    found: list            # the runs under --from, each read once ([] without --from)


def run_projection(args):
    """The projection from measurements and/or given hardware."""
    check_args(args)
    tuning = methods.tuning_of(args)
    slow = {s.rank: s.factor for s in parse_stragglers(args.straggler)} if args.straggler else {}
    inp = load_inputs(args, tuning)
    nets, layers, compute = inp.nets, inp.layers, inp.compute
    ring, servers = (nets[key] for key in generic_networks())
    grad = sum(x.grad_bytes for x in layers)
    own = own_rows(nets, ring, inp.variants)
    rows = project(layers, compute, powers_of_two(1, args.max_workers), nets, per_server=args.gpus_per_server,
                   tuning=tuning, straggler_cv=args.straggler_cv, measured=inp.measured, own=own, slow=slow)
    make_dirs(args.out)
    text = header_text(args, inp, grad, own, slow)
    checked, left_out = check_runs(inp.found, layers, nets, tuning)
    text += checked_text(checked, left_out)
    cross = []
    if args.from_dir:
        cross = crossover.analyse([f.row for f in healthy_of(inp.found)],
                                  lambda row, shard_bytes: projected_step(row, shard_bytes, layers, nets, tuning)[0],
                                  layers=layers,
                                  contended=[name for name, _ in left_out])
        if cross:
            text += "\n".join(crossover_render.section(cross, left_out)) + "\n![crossover](crossover.png)\n\n"
    held = heldout_of(inp.found, layers, nets, tuning) if args.from_dir else ([], None)
    if held[0]:
        text += "\n".join(heldout_render.section(*held)) + "\n"
    replays, trusted, scaled, replayed_text = replayed_of(args, inp, tuning, held)
    text += replayed_text
    sick = unhealthy_check(inp.found, args.from_dir, args.healthy_dir, layers, tuning) if args.from_dir else ([], [])
    if sick[0] or sick[1]:
        text += "\n".join(heldout_render.unhealthy_section(*sick)) + "\n"
    text += table(rows) + "\n"
    ring_rows = [r for r in rows if r.arch == methods.scheduler(collective=True).panel and r.workers > 1]
    if ring_rows:
        top = ring_rows[-1]
        text += (f"\n{top.arch[0].upper()}{top.arch[1:]} at {top.workers} workers: {top.overlap:.0%} of its exchange "
                 f"hides behind back-propagation (wait-free schedule of this model's layers).\n")
    write_atomic(os.path.join(args.out, "projection.md"), text + "\n![projection](projection.png)\n")
    write_atomic(os.path.join(args.out, "projection.json"), dumps({
                       "grad_bytes": grad, "layers": len(layers), "compute_s": compute, "ring": ring, "ps": servers,
                       "own_fits": {label: net for label, (_, net, _, _) in own.items() if net != ring},
                       "gpus_per_server": args.gpus_per_server, "straggler_cv": args.straggler_cv,
                       **{o.flag: getattr(args, o.flag) for o in methods.options()},
                       "measured_overlap": {label: ov for label, (ov, _) in inp.measured.items()}, "checked": checked,
                       "left_out": [{"run": name, "why": why} for name, why in left_out], "crossover": cross,
                       "heldout": {"entries": held[0] + replays, "cores": held[1],
                                   "trusted": trusted},
                       "replayed": scaled,
                       "unhealthy": {"entries": sick[0], "left_out": [{"run": n, "why": w} for n, w in sick[1]]},
                       "slow": slow, "rows": rows}))
    if cross:
        crossover_render.plot(cross, os.path.join(args.out, "crossover.png"))
    plot(rows, os.path.join(args.out, "projection.png"), f"{_size(grad)} gradients, "
         f"{compute * 1e3:.0f} ms compute")
    print(text)
    return 0


def check_args(args):
    """The flags' ranges and the folders and files they name, before anything is read."""
    for name in ("bandwidth_gbps", "latency_us", "step_compute_ms", "model_params", "straggler_cv"):
        if getattr(args, name) is not None:
            check_finite(name.replace("_", "-"), getattr(args, name))
    for name, (low, high) in INPUT_RANGES.items():
        value = getattr(args, name)
        if value is not None and not low <= value <= high:
            raise UsageError(f"--{name.replace('_', '-')} must be in [{low:g}, {high:g}], got {value!r}")
    if not 0 <= args.straggler_cv < 1:
        raise UsageError("--straggler_cv must be in [0, 1)")
    if not 1 <= args.gpus_per_server <= 1024 or not 1 <= args.max_workers <= MAX_WORKERS:
        raise UsageError(f"--gpus_per_server must be in [1, 1024] and --max_workers in [1, {MAX_WORKERS}]")
    if args.healthy_dir and (not args.from_dir or not os.path.isdir(args.healthy_dir)):
        raise UsageError(f"--healthy {args.healthy_dir}: " + ("no such directory" if args.from_dir else
                                                             "needs --from, the runs it is the healthy twin of"))
    if args.comm_json and not os.path.exists(args.comm_json):
        raise UsageError(f"--comm_json {args.comm_json}: no such file")
    if args.from_dir and not os.path.isdir(args.from_dir):
        raise UsageError(f"--from {args.from_dir}: no such directory")
    if args.model_name and args.model_name not in known_models():
        raise UsageError(f"unknown --model_name '{args.model_name}' (valid: {', '.join(known_models())})")


def load_inputs(args, tuning):
    """The networks (given, fitted from comm.json, or the emulated cluster's), the model's layers and
    compute (a shipped profile, --model_params, or the runs'), and what the runs measured."""
    comm_json = args.comm_json or os.path.join(REPO, "benchmarks", "results", "comm.json")
    cluster = cluster_of(args.from_dir) if args.from_dir and not args.comm_json else None
    fits = {}
    if os.path.exists(comm_json) and (args.bandwidth_gbps is None or args.latency_us is None) and \
            not (cluster and cluster.latency_s is not None):
        comm = read_comm(comm_json)
        fits = fit_from_comm(comm.results, comm.np)
    nets = networks(args, fits, comm_json, cluster, tuning)
    if not all(nets[key] for key in generic_networks()):
        raise UsageError(f"--project: no measurements at {comm_json} (run benchmarks/comm_bandwidth.py) "
                         f"and no --bandwidth_gbps/--latency_us given")
    layers = known_models()[args.model_name].layers if args.model_name else None
    if args.model_params and not layers:
        layers = single_layer(args.model_params * 4e6)
    compute = args.step_compute_ms / 1e3 if args.step_compute_ms else None
    measured, notes, variants, found = {}, [], [], []
    if args.from_dir:
        found = load_found(args.from_dir)
        run_compute, run_layers, measured, notes, variants = from_runs(found, args.from_dir, nets)
        compute = compute or run_compute
        layers = layers or run_layers
    if not layers or not compute:
        raise UsageError("--project needs the model (--model_name, --model_params or --from) "
                         "and the compute time (--step_compute_ms or --from)")
    return Inputs(nets, cluster, comm_json, layers, compute, measured, notes, variants, found)


def header_text(args, inp, grad, own, slow):
    """projection.md's opening: the model, the networks and knobs it was costed on, what the runs measured."""
    ring, ps = (inp.nets[key] for key in generic_networks())
    cluster = inp.cluster
    knobs = [o.says.format(getattr(args, o.flag)) for o in methods.options()
             if o.says and getattr(args, o.flag) is not None]
    text = (f"# Scaling projection\n\ngradient {_size(grad)} in {len(inp.layers)} layer(s), compute "
            f"{inp.compute * 1e3:.1f} ms/step, ring: {ring.bandwidth * 8 / 1e9:.2f} Gbit/s, alpha "
            f"{ring.alpha * 1e6:.1f} us; PS: {ps.bandwidth * 8 / 1e9:.2f} Gbit/s, alpha "
            f"{ps.alpha * 1e6:.1f} us; {args.gpus_per_server} worker(s) per server; " +
            "".join(f"{k}; " for k in knobs) + f"straggler cv {args.straggler_cv:g}" +
            "".join(f"; worker {r} at {f:g}x the others' compute" for r, f in slow.items()) + "\n\n")
    for label, (_, net, _, _) in own.items():
        if net == ring:
            continue                 # costed on the ring's network, by a step model of its own
        text += (f"{label}: its own fit from {inp.comm_json}, {net.bandwidth * 8 / 1e9:.2f} Gbit/s, alpha "
                 f"{net.alpha * 1e6:.1f} us.\n\n")
    if cluster and cluster.latency_s is not None and (args.bandwidth_gbps is None or args.latency_us is None):
        rate = cluster.rate or f"{cluster.rate_bps / 1e6:g} Mbit/s"
        if slowest_link_bps(cluster) < cluster.rate_bps:
            rate += f"; its slowest, {slowest_link_bps(cluster) / 1e6:g} Mbit/s, taken for every link"
        text += (f"Network: the emulated cluster's links ({rate}, carrying {TCP_GOODPUT:.1%} of it as "
                 f"TCP payload; latency {cluster.latency_s * 1e6:.0f} us, half the measured round trip).\n\n")
    if inp.notes:
        text += "Measured in the runs:\n\n" + "\n".join(f"- {x}" for x in inp.notes) + "\n\n"
    return text


def checked_text(checked, left_out):
    """The section of each multi-worker run's step beside the model's."""
    text = "## Projected against measured\n\n" if checked or left_out else ""
    if checked:
        ratios = sorted(r.ratio for r in checked)
        text += ("Each multi-worker run's median step beside what the model "
                 "above gives for its backend, worker count, gradient, PS shards and its own compute "
                 f"(docs/projection.md); measured / projected from {ratios[0]:.2f} to {ratios[-1]:.2f}, "
                 f"median {ratios[len(ratios) // 2]:.2f}.\n\n" + check_table(checked) + "\n\n")
    if left_out:
        text += ("Left out of this check, since they measured contention for the cores, not the method: " +
                 "; ".join(f"{name} ({why})" for name, why in left_out) + ".\n\n")
    return text


@cli
def main(argv=None):
    args = make_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if os.path.lexists(args.out) and not os.path.isdir(args.out):
        raise UsageError(f"--out {args.out} exists and is not a directory")
    with plugins_bounded(args.run_timeout, "--run_timeout"):   # rebuilding a recorded plug-in: bounded
        return run_projection(args)


if __name__ == "__main__":
    sys.exit(main())
