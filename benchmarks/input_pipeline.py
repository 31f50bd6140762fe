"""Training from TFRecord files: does the input keep up, and does a worker stream a set larger than memory?

    python benchmarks/input_pipeline.py --part keeps_up [--repeats 3]    # files against the same data in memory
    python benchmarks/input_pipeline.py --part larger [--images 180000]  # ResNet-50 on a set > 4x a worker's memory

keeps_up: the digits CNN, every method at 1 and 2 workers (one core each, as benchmarks/throughput.py),
trained from the digits in memory and from the same digits as 8 TFRecord shards (`hvdps data`, plain
layout), pairs alternating (memory first, then files first, ...). Samples/sec is each run's median
over logging intervals; the ratio is files / memory, from the medians over the repeats. The input's
share of the step is each run's wait for its next batch at the iterator (the all-reduce trainers'
custom loop; the PS trainers read their batches inside the graph or on remote workers: not measured).

larger: a synthetic set in the imagenet layout (`hvdps data --layout imagenet`, 224x224x3 random JPEGs,
resized to 64x64 for training), ResNet-50 at 2 workers, Horovod and sync PS, batch 8 per worker.
Each job runs under a parent that reads getrusage(RUSAGE_CHILDREN): the peak resident memory of the
largest process in the job (a rank, a worker or the PS). The set's size on disk is measured with the
files' sizes. Results: benchmarks/results/input_pipeline_<part>.json and a markdown table.
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
from benchmarks.results_file import save  # noqa: E402
from common.base.errors import UsageError, cli  # noqa: E402
from common.base.flags import Parser  # noqa: E402
from hvdps.measure.rows import load_run  # noqa: E402
from common.base.procs import child_env  # noqa: E402
from hvdps.methods import get_launcher, parse_variants  # noqa: E402

HVDPS = os.path.join(os.path.dirname(sys.executable), "hvdps")
# a job's peak resident memory: the largest of its processes, as the kernel kept it for the parent
PEAK = ("import resource, subprocess, sys\n"
        "code = subprocess.run(sys.argv[1:]).returncode\n"
        "print('peak_rss_kib', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, flush=True)\n"
        "sys.exit(code)\n")


def launch(variant, workers, flags, out, env, pin=True, measure_peak=False):
    backend, mode = variant
    launcher = get_launcher(backend)
    argv = launcher.command(workers, [*flags, "--train_dir", out], mode=mode, tasks=launcher.default_tasks(),
                            pin_cores=pin)
    if measure_peak:
        argv = [sys.executable, "-c", PEAK, *argv]
    p = subprocess.run(argv, capture_output=True, text=True, env={**env, **launcher.env()}, cwd=REPO, timeout=3600)
    row = {"method": f"{backend}:{mode}", "workers": workers, "ok": p.returncode == 0}
    if p.returncode != 0:
        row["error"] = (p.stderr or p.stdout)[-800:]
        return row
    r = load_run(out)
    row.update(samples_per_sec=r.samples_per_sec_median, step_ms=_ms(r.step_s), input_ms=_ms(r.input_s),
               input_share=r.input_share)
    for line in p.stdout.splitlines():
        if line.startswith("peak_rss_kib "):
            row["job_peak_rss_mib"] = round(int(line.split()[1]) / 1024, 1)
    row["chief_peak_rss_mib"] = r.peak_rss_mib
    return row


def _ms(seconds):
    return None if seconds is None else round(1000 * seconds, 3)


# The pipeline alone, no model: the same batches of 32, memory and files alternating, on one core with one
# TensorFlow thread (as a pinned worker): what each batch costs the core before any training.
ALONE = """
import os, statistics, sys, time
sys.path.insert(0, {repo!r})
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
from common.spec.config import make_config
from common.inputs.data import make_dataset
cfgs = {{"memory": make_config(batch_size=32, dataset="digits"),
        "files": make_config(batch_size=32, dataset="tfrecord", data_dir={data!r})}}
times = {{"memory": [], "files": []}}
for rep in range(5):
    for name in (("memory", "files") if rep % 2 == 0 else ("files", "memory")):
        ds = make_dataset(cfgs[name], 0, 1, num_steps=400)
        t = time.perf_counter()
        n = sum(1 for _ in ds)
        times[name].append(1000 * (time.perf_counter() - t) / n)
print("alone", statistics.median(times["memory"]), statistics.median(times["files"]))
"""


def pipeline_alone(data, env):
    """ms per batch of the memory and the files pipelines alone, on core 0 (medians of 5, alternating)."""
    p = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", ALONE.format(repo=REPO, data=data)],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    line = next((x for x in p.stdout.splitlines() if x.startswith("alone ")), None)
    if line is None:
        raise UsageError(f"the pipeline-alone run failed: {(p.stderr or p.stdout)[-500:]}")
    memory, files = (float(x) for x in line.split()[1:])
    return {"memory_ms_per_batch": round(memory, 3), "files_ms_per_batch": round(files, 3)}


def keeps_up(args, env, tmp):
    data = os.path.join(tmp, "digits")
    subprocess.run([HVDPS, "data", "--dataset", "digits", "--shards", "8", "--out", data], check=True,
                   capture_output=True, cwd=REPO, env=env)
    alone = pipeline_alone(data, env)
    print(json.dumps(alone), flush=True)
    sources = {"memory": ["--dataset", "digits"], "files": ["--dataset", "tfrecord", "--data_dir", data]}
    common = ["--model", "cnn", "--batch_size", "32", "--train_steps", str(args.steps), "--warmup_steps", "10",
              "--log_every", "5", "--eval_every_epoch", "false", "--checkpoint_every_epoch", "false"]
    rows = []
    for rep in range(args.repeats):
        order = ["memory", "files"] if rep % 2 == 0 else ["files", "memory"]
        for variant in (v.pair for v in parse_variants(args.backends)):
            for workers in (1, 2):
                for source in order:                          # the pair back to back, its order alternating
                    out = os.path.join(tmp, f"{source}-{'-'.join(variant)}-w{workers}-{rep}")
                    row = launch(variant, workers, [*sources[source], *common], out, env)
                    row.update(source=source, repeat=rep)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    shutil.rmtree(out, ignore_errors=True)
    pairs = []
    for variant in (":".join(v.pair) for v in parse_variants(args.backends)):
        for workers in (1, 2):
            med = {}
            for source in ("memory", "files"):
                got = [r for r in rows if r["method"] == variant and r["workers"] == workers and r["source"] == source
                       and r["ok"]]
                med[source] = statistics.median(r["samples_per_sec"] for r in got) if got else None
                shares = [r["input_share"] for r in got if r.get("input_share") is not None]
                med[source + "_input_share"] = statistics.median(shares) if shares else None
            ratio = med["files"] / med["memory"] if med["files"] and med["memory"] else None
            pairs.append({"method": variant, "workers": workers, **med, "ratio": ratio})
    text = keeps_up_table(pairs) + (
        f"\n\nThe pipeline alone on one core, per batch of 32: {alone['memory_ms_per_batch']:.2f} ms from memory, "
        f"{alone['files_ms_per_batch']:.2f} ms from the files.")
    return rows, {"pairs": pairs, "pipeline_alone": alone}, text


def keeps_up_table(pairs):
    pct = lambda x: "-" if x is None else f"{100 * x:.0f}%"
    num = lambda x: "failed" if x is None else f"{x:,.0f}"
    lines = ["| method | workers | samples/s in memory | samples/s from files | files / memory | "
             "input share (memory) | input share (files) |", "|---|---|---|---|---|---|---|"]
    for p in pairs:
        ratio = "-" if p["ratio"] is None else f"{p['ratio']:.2f}"
        lines.append(f"| {p['method']} | {p['workers']} | {num(p['memory'])} | {num(p['files'])} | {ratio} | "
                     f"{pct(p['memory_input_share'])} | {pct(p['files_input_share'])} |")
    return "\n".join(lines)


def larger(args, env, tmp):
    data = os.path.join(args.data_dir or tmp, "imagenet")
    if not os.path.exists(os.path.join(data, "dataset.json")):
        subprocess.run([HVDPS, "data", "--dataset", "synthetic", "--layout", "imagenet", "--image_shape", "224,224,3",
                        "--resize", "64,64", "--num_classes", "100", "--synthetic_samples", str(args.images),
                        "--shards", "64", "--out", data], check=True, capture_output=True, cwd=REPO, env=env)
    size_mib = sum(os.path.getsize(os.path.join(data, f)) for f in os.listdir(data)) / 2 ** 20
    flags = ["--model", "resnet50", "--dataset", "tfrecord", "--data_dir", data, "--batch_size", "8",
             "--train_steps", str(args.steps), "--warmup_steps", "4", "--log_every", "2", "--probe_steps", "6",
             "--eval_every_epoch", "false", "--checkpoint_every_epoch", "false"]
    rows = []
    for variant in (("horovod", "sync"), ("ps", "sync")):
        out = os.path.join(tmp, "-".join(variant))
        row = launch(variant, 2, flags, out, env, pin=False, measure_peak=True)
        row.update(set_mib=round(size_mib, 1),
                   set_over_peak=round(size_mib / row["job_peak_rss_mib"], 2) if row.get("job_peak_rss_mib") else None)
        rows.append(row)
        print(json.dumps(row), flush=True)
    lines = ["| method | workers | set on disk (MiB) | job's peak RSS (MiB) | set / peak | samples/s | step (ms) | "
             "input share |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if not r["ok"]:
            lines.append(f"| {r['method']} | 2 | {r['set_mib']:,.0f} | failed | | | | |")
            continue
        share = "not measured" if r["input_share"] is None else f"{100 * r['input_share']:.1f}%"
        lines.append(f"| {r['method']} | 2 | {r['set_mib']:,.0f} | {r['job_peak_rss_mib']:,.0f} | "
                     f"{r['set_over_peak']:.1f} | {r['samples_per_sec']:.1f} | {r['step_ms']:.0f} | {share} |")
    return rows, None, "\n".join(lines)


@cli
def main():
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", required=True, choices=("keeps_up", "larger"))
    ap.add_argument("--repeats", type=int, default=3, help="keeps_up: pairs per method and worker count")
    ap.add_argument("--backends", default="horovod,mpi,mwms,ps,ps2", help="keeps_up: the methods (--backends' spelling)")
    ap.add_argument("--steps", type=int, default=None, help="training steps per run (keeps_up 120, larger 20)")
    ap.add_argument("--images", type=int, default=180000, help="larger: training images in the synthetic set")
    ap.add_argument("--data_dir", default=None, help="larger: keep the synthetic set here (reused when present)")
    ap.add_argument("--out", default=None)
    for name in ("repeats", "images"):
        ap.bound(name, 1, 1 << 30)
    args = ap.parse_args()
    if args.steps is not None and args.steps < 1:
        raise UsageError(f"--steps must be >= 1, got {args.steps}")
    args.steps = args.steps or (120 if args.part == "keeps_up" else 20)
    out = args.out or os.path.join(HERE, "results", f"input_pipeline_{args.part}.json")
    env, tmp = child_env(), tempfile.mkdtemp(prefix="hvdps-input-")
    try:
        rows, pairs, text = (keeps_up if args.part == "keeps_up" else larger)(args, env, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    save(out, args, rows=rows, **(pairs or {}), table=text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
