"""Projecting step time and scaling efficiency past this machine, with the alpha-beta model.

Communication cost of one exchange of an M-byte gradient among n workers on
links of bandwidth B (bytes/s) and per-message latency alpha (s):

  ring all-reduce (Horovod):   T = 2(n-1)/n * M/B + 2(n-1) * alpha
  PS with k shards:            T = 2 * max(n*M/(k*B_ps), g*M/B) + 2 * alpha
      (push then pull; each PS receives n*M/k bytes per direction, each server's
       NIC carries the g workers it hosts; g = workers per server)

A step is compute plus the part of communication not hidden behind
backpropagation: T_step = T_compute + (1 - overlap) * T_comm. Efficiency is
T_compute / T_step: throughput(n) / (n * throughput(1)). ``overlap`` (0..1) is
the fraction of communication assumed to run concurrently with backprop
(Horovod and TF both start sending the last layers' gradients while earlier
layers still compute); 0 is the pessimistic bound. Ring all-reduce's latency
term uses every hop; with several GPUs per server the ring's inter-server links
are the bottleneck, which is why B is the inter-server bandwidth.
"""
import json
import math
import os
import sys

from common.errors import UsageError, cli
from common.metrics import load_run
from common.procs import REPO

# Parameter counts (millions) of well-known models, and nominal single-GPU step
# times used only for the documented Horovod-benchmark comparison (docs/projection.md).
KNOWN_MODELS = {
    "resnet50": 25.6, "resnet101": 44.5, "inception_v3": 23.8, "vgg16": 138.4,
}


def ring_allreduce_time(n, nbytes, bandwidth, alpha):
    if n <= 1:
        return 0.0
    return 2.0 * (n - 1) / n * nbytes / bandwidth + 2.0 * (n - 1) * alpha


def ps_time(n, nbytes, bandwidth, alpha, shards=1, per_server=1, ps_bandwidth=None):
    ps_bw = ps_bandwidth or bandwidth
    per_dir = max(n * nbytes / (shards * ps_bw), min(per_server, n) * nbytes / bandwidth)
    return 2.0 * per_dir + 2.0 * alpha


def efficiency(compute, comm, overlap=0.0):
    return compute / (compute + (1.0 - overlap) * comm)


def fit_alpha_beta(points):
    """Least-squares fit of t = alpha + bytes/B to (bytes, seconds) points -> (alpha, B)."""
    pts = [(float(b), float(t)) for b, t in points if t > 0]
    if len(pts) < 2:
        raise ValueError("need at least two measurements to fit latency and bandwidth")
    n = len(pts)
    mx = sum(b for b, _ in pts) / n
    my = sum(t for _, t in pts) / n
    sxx = sum((b - mx) ** 2 for b, _ in pts)
    slope = sum((b - mx) * (t - my) for b, t in pts) / sxx if sxx else 0.0
    slope = max(slope, 1e-15)
    alpha = max(my - slope * mx, 0.0)
    return alpha, 1.0 / slope


def fit_from_comm(comm_results, np_=2):
    """alpha/B for ring all-reduce (Horovod rows) and PS push/pull from comm.json results.

    The 2-rank ring moves M/B and pays 2 alphas, so t = 2*alpha + M/B; push and
    pull each pay one alpha and move M once.
    """
    def pts(prefix):
        return [(r["bytes"], r["seconds"]) for r in comm_results if r["impl"].startswith(prefix)]

    fits = {}
    hv = [r for r in comm_results if r["impl"].startswith("horovod")]
    if hv:
        best = {}
        for r in hv:   # best Horovod setting per size: what a tuned trainer gets
            best[r["bytes"]] = min(best.get(r["bytes"], float("inf")), r["seconds"])
        a, b = fit_alpha_beta(best.items())
        scale = 2.0 * (np_ - 1) / np_
        fits["allreduce"] = {"alpha": a / (2 * (np_ - 1)), "bandwidth": b * scale}
    for impl in ("ps-push", "ps-pull"):
        p = pts(impl)
        if p:
            a, b = fit_alpha_beta(p)
            fits[impl] = {"alpha": a, "bandwidth": b}
    if "ps-push" in fits and "ps-pull" in fits:
        fits["ps"] = {"alpha": (fits["ps-push"]["alpha"] + fits["ps-pull"]["alpha"]) / 2,
                      "bandwidth": 2 / (1 / fits["ps-push"]["bandwidth"] + 1 / fits["ps-pull"]["bandwidth"])}
    return fits


def project(grad_bytes, compute_s, workers, ring, ps, shards=(1, 2, 4), per_server=1, overlap=0.0):
    """Rows of projected step time and efficiency for each worker count and architecture."""
    rows = []
    for n in workers:
        t = ring_allreduce_time(n, grad_bytes, ring["bandwidth"], ring["alpha"])
        rows.append({"workers": n, "arch": "ring all-reduce", "comm_s": t,
                     "step_s": compute_s + (1 - overlap) * t, "efficiency": efficiency(compute_s, t, overlap)})
        for k in shards:
            t = ps_time(n, grad_bytes, ps["bandwidth"], ps["alpha"], k, per_server)
            rows.append({"workers": n, "arch": f"PS k={k}", "comm_s": t,
                         "step_s": compute_s + (1 - overlap) * t, "efficiency": efficiency(compute_s, t, overlap)})
    return rows


def powers_of_two(lo, hi):
    out, n = [], lo
    while n <= hi:
        out.append(n)
        n *= 2
    return out


def table(rows):
    archs = []
    for r in rows:
        if r["arch"] not in archs:
            archs.append(r["arch"])
    by = {(r["workers"], r["arch"]): r for r in rows}
    lines = ["| workers | " + " | ".join(f"{a} eff. (step ms)" for a in archs) + " |",
             "|---|" + "---|" * len(archs)]
    for n in sorted({r["workers"] for r in rows}):
        cells = [f"{100 * by[(n, a)]['efficiency']:.0f}% ({1e3 * by[(n, a)]['step_s']:.0f})" for a in archs]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for arch in dict.fromkeys(r["arch"] for r in rows):
        rs = [r for r in rows if r["arch"] == arch]
        ax.plot([r["workers"] for r in rs], [r["efficiency"] for r in rs], "o-", label=arch)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="workers", ylabel="projected scaling efficiency", ylim=(0, 1.05), title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def params_bytes(model_params=None, model_name=None):
    if model_params:
        return int(model_params * 4)
    if model_name in KNOWN_MODELS:
        return int(KNOWN_MODELS[model_name] * 1e6 * 4)
    return None


def dumps(obj):
    return json.dumps(obj, indent=2, default=lambda x: None if isinstance(x, float) and math.isnan(x) else x)


# ---------------------------------------------------------------- command line
def make_parser():
    from common.config import Parser
    p = Parser(prog="hvdps-project", description="Project scaling efficiency to many workers "
               "(alpha-beta model, no training); also reachable as hvdps-compare --project")
    p.add_argument("--comm-json", dest="comm_json", default=None,
                   help="measured latency/bandwidth (benchmarks/results/comm.json) to fit the model from")
    p.add_argument("--bandwidth-gbps", dest="bandwidth_gbps", type=float, default=None,
                   help="link bandwidth in Gbit/s (overrides the measured fit)")
    p.add_argument("--latency-us", dest="latency_us", type=float, default=None, help="per-message latency")
    p.add_argument("--step-compute-ms", dest="step_compute_ms", type=float, default=None,
                   help="compute time of one step on one worker")
    p.add_argument("--model-params", dest="model_params", type=float, default=None,
                   help="parameters (millions) of the model whose gradients are exchanged")
    p.add_argument("--model-name", dest="model_name", default=None,
                   help="known model for --model-params: resnet50, resnet101, inception_v3, vgg16")
    p.add_argument("--gpus-per-server", dest="gpus_per_server", type=int, default=1)
    p.add_argument("--overlap", type=float, default=0.0,
                   help="fraction of communication hidden behind backprop (0 = none)")
    p.add_argument("--max-workers", dest="max_workers", type=int, default=512)
    p.add_argument("--compute-from", dest="compute_from", default=None,
                   help="a 1-worker run dir: compute time per step = batch / its samples/sec")
    p.add_argument("--out", default="runs/projection", help="where projection.md/json/png go")
    return p


def run_projection(args):
    """The alpha-beta projection from measurements and/or given hardware."""
    from common.config import check_finite
    fits = {}
    for name in ("bandwidth_gbps", "latency_us", "step_compute_ms", "model_params", "overlap"):
        if getattr(args, name) is not None:
            check_finite(name.replace("_", "-"), getattr(args, name))
    comm_json = args.comm_json or os.path.join(REPO, "benchmarks", "results", "comm.json")
    for name in ("bandwidth_gbps", "latency_us", "step_compute_ms", "model_params"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive, got {value}")
    if args.comm_json and not os.path.exists(args.comm_json):
        raise UsageError(f"--comm-json {args.comm_json}: no such file")
    if os.path.exists(comm_json) and (args.bandwidth_gbps is None or args.latency_us is None):
        try:
            data = json.load(open(comm_json))
            fits = fit_from_comm(data["results"], data.get("np", 2))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"--comm-json {comm_json}: not a comm_bandwidth.py result file ({exc})")
    ring, ps = fits.get("allreduce"), fits.get("ps")
    if args.bandwidth_gbps is not None or args.latency_us is not None:
        if args.bandwidth_gbps is None or args.latency_us is None:
            if not ring:
                raise UsageError("--project needs both --bandwidth-gbps and --latency-us, or a --comm-json")
        bw = args.bandwidth_gbps * 1e9 / 8 if args.bandwidth_gbps is not None else ring["bandwidth"]
        lat = args.latency_us * 1e-6 if args.latency_us is not None else ring["alpha"]
        ring = ps = {"bandwidth": bw, "alpha": lat}
    if not ring or not ps:
        raise UsageError(f"--project: no measurements at {comm_json} (run benchmarks/comm_bandwidth.py) "
                         f"and no --bandwidth-gbps/--latency-us given")
    if args.model_name and args.model_name not in KNOWN_MODELS:
        raise UsageError(f"unknown --model-name '{args.model_name}' (valid: {', '.join(KNOWN_MODELS)})")
    grad = params_bytes(args.model_params, args.model_name)
    compute = args.step_compute_ms / 1e3 if args.step_compute_ms else None
    if args.compute_from:
        row, curves = load_run(args.compute_from)
        if not row.get("samples_per_sec_median"):
            raise UsageError(f"--compute-from {args.compute_from}: no throughput in that run")
        compute = compute or row["global_batch"] / row["samples_per_sec_median"]
        grad = grad or row["grad_bytes_per_step"]
    if not grad or not compute:
        raise UsageError("--project needs the gradient size (--model-params, --model-name or --compute-from) "
                         "and the compute time (--step-compute-ms or --compute-from)")
    if not 0 <= args.overlap < 1 or args.gpus_per_server < 1 or args.max_workers < 1:
        raise UsageError("--overlap must be in [0, 1), --gpus-per-server and --max-workers >= 1")
    workers = powers_of_two(1, args.max_workers)
    rows = project(grad, compute, workers, ring, ps, shards=powers_of_two(1, 8),
                      per_server=args.gpus_per_server, overlap=args.overlap)
    os.makedirs(args.out, exist_ok=True)
    text = (f"# Scaling projection\n\ngradient {grad / 1e6:.1f} MB, compute {compute * 1e3:.1f} ms/step, "
            f"ring: {ring['bandwidth'] * 8 / 1e9:.2f} Gbit/s, alpha {ring['alpha'] * 1e6:.1f} us; "
            f"PS: {ps['bandwidth'] * 8 / 1e9:.2f} Gbit/s, alpha {ps['alpha'] * 1e6:.1f} us; "
            f"{args.gpus_per_server} worker(s) per server; overlap {args.overlap:.0%}\n\n" + table(rows) + "\n")
    with open(os.path.join(args.out, "projection.md"), "w") as f:
        f.write(text + "\n![projection](projection.png)\n")
    with open(os.path.join(args.out, "projection.json"), "w") as f:
        f.write(dumps({"grad_bytes": grad, "compute_s": compute, "ring": ring, "ps": ps,
                          "overlap": args.overlap, "gpus_per_server": args.gpus_per_server, "rows": rows}))
    plot(rows, os.path.join(args.out, "projection.png"), f"{grad / 1e6:.0f} MB gradients, "
            f"{compute * 1e3:.0f} ms compute")
    print(text)
    return 0


@cli
def main(argv=None):
    args = make_parser().parse_args(sys.argv[1:] if argv is None else argv)
    return run_projection(args)


if __name__ == "__main__":
    sys.exit(main())
