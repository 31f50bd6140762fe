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
