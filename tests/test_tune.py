"""hvdps tune: each method's space, the cost model's pruning from a probe, successive halving, the
finalists judged, and real tunes: one that picks the far better cycle time, stopped mid-trial and
resumed without rerunning a finished trial."""
import argparse
import json
import os
import re
import signal
import subprocess
import time

import pytest

from common.base.errors import UsageError
from dataclasses import replace

from common.formats.schemas import Eval, Header
from hvdps.measure.rows import Curves, RunRow
from hvdps.render.report import hint_lines
from hvdps.tune import search, space
from hvdps.tune.hints import hints
from tests.conftest import BIN, REPO, env

ARGS = argparse.Namespace(num_ps=[1])
HOROVOD_CYCLES = "horovod[cycle_time_ms=0.1|10,fusion_threshold_mb=128,fp16_allreduce=false,num_groups=0]"


def entries(text):
    return {name: [c.entry for c in space.candidates(name, axes, ARGS)] for name, axes in space.parse_space(text).items()}


@pytest.mark.parametrize("text, expected", [
    # a method's declared space, the defaults first (a setting at its default is left out of the entry)
    ("mpi", {"mpi": ["mpi:sync"]}),
    (HOROVOD_CYCLES, {"horovod": ["horovod:sync", "horovod:sync[cycle_time_ms=0.1]", "horovod:sync[cycle_time_ms=10]"]}),
    ("ps:async|sync[num_ps=1]", {"ps": ["ps:async[num_ps=1]", "ps:sync[num_ps=1]"]}),
    ("ps:sync[num_ps=2]", {"ps": ["ps:async[num_ps=1]", "ps:sync[num_ps=2]"]}),     # the defaults still run
    ("localsgd:2|8", {"localsgd": ["localsgd:8", "localsgd:2"]}),
    ("mwms[implementation=ring,pack_size_mb=0|4]", {"mwms": ["mwms:sync", "mwms:sync[pack_size_mb=4]"]}),
])
def test_a_space_is_the_method_s_axes_narrowed_by_its_entry(text, expected):
    assert entries(text) == expected


def test_each_method_declares_its_space():
    got = entries("horovod,mpi,mwms,ps,localsgd,gossip")
    assert len(got["horovod"]) == 3 * 2 * 2 * 2 and got["horovod"][0] == "horovod:sync"
    assert len(got["mwms"]) == 4 and len(got["ps"]) == 6 and got["localsgd"] == ["localsgd:8", "localsgd:2", "localsgd:32"]
    assert got["gossip"] == ["gossip:ring"] and got["mpi"] == ["mpi:sync"]
    ps = space.candidates("ps", space.parse_space("ps")["ps"], ARGS)
    assert {c.group for c in ps} == {(), (("mode", "sync"),), (("mode", "backup1"),)}     # async, sync, backups


@pytest.mark.parametrize("text, message", [
    ("horovod[cycle=1]", r"horovod has no axis 'cycle' \(horovod tunes mode, cycle_time_ms"),
    ("horovod[cycle_time_ms=0.1|x]", r"'x' is not a value of cycle_time_ms"),
    ("horovod[cycle_time_ms=]", r"'' is not a value of cycle_time_ms"),
    ("horovod[cycle_time_ms=2000]", r"'2000' is not a value of cycle_time_ms"),
    ("horovod[cycle_time_ms=1,cycle_time_ms=2]", r"cycle_time_ms is given twice"),
    ("ps:sometimes", r"'sometimes' is not a value of mode"),
    ("mpi,mpi", r"names mpi twice"),
    ("nccl", r"unknown backend|nccl"),
    ("horovod[cycle_time_ms=1]:sync", r"axes go last"),
    ("", r"--backends is empty"),
])
def test_bad_spaces_are_usage_errors(text, message):
    with pytest.raises(UsageError, match=message):
        space.parse_space(text)


def probe(step_s=3.0e-3, compute_s=0.7e-3, backend="horovod", **kw):
    return RunRow(run_dir=f"/x/{backend}-sync-w2", backend=backend, mode="sync", workers=2, status="ok", step_s=step_s,
                  compute_s=compute_s, grad_bytes_per_step=30040, samples_per_sec_median=64 / step_s, **kw)


def test_the_probe_s_network_gives_its_step_and_the_model_prunes_the_far_worse():
    """On 1 ms steps the model, fitted to the probe, predicts the 10 ms cycle far slower: it is not run."""
    cands = space.candidates("horovod", space.parse_space(HOROVOD_CYCLES)["horovod"], ARGS)
    p = probe()
    tuning = search.methods.tuning()
    net = search.probe_network(p, tuning)
    predicted = {c: search.predict(c, p, net, tuning) for c in cands}
    assert predicted[cands[0]] == pytest.approx(p.step_s, rel=1e-3)          # the defaults: the probe's own step
    ranked = {r.candidate.entry: r for r in search.rank(cands, predicted)}
    assert ranked["horovod:sync[cycle_time_ms=10]"].pruned.startswith("predicted")
    assert ranked["horovod:sync[cycle_time_ms=0.1]"].pruned is None
    assert ranked["horovod:sync[cycle_time_ms=0.1]"].predicted_s < p.step_s


def test_a_setting_the_model_sees_no_move_in_is_not_run_but_the_defaults_always_are():
    cands = space.candidates("horovod", space.parse_space(
        "horovod[cycle_time_ms=1,fusion_threshold_mb=128|8,fp16_allreduce=false|true,num_groups=0]")["horovod"], ARGS)
    predicted = {c: 2e-3 for c in cands}             # one layer of 30 kB: the fusion buffer changes nothing
    ranked = {r.candidate.entry: r for r in search.rank(cands, predicted)}
    assert "nothing to move" in ranked["horovod:sync[fusion_threshold_mb=8]"].pruned
    assert ranked["horovod:sync"].pruned is None
    # fp16 trains differently and the model does not see it: run, beside the defaults
    assert ranked["horovod:sync[fp16_allreduce=true]"].pruned is None


def _measured(rates, budget_after=None):
    calls = []

    def measure(c, rung, steps):
        if budget_after is not None and len(calls) >= budget_after:
            raise search.OutOfBudget("no time left")
        calls.append((c.entry, rung, steps))
        return RunRow(run_dir="x", status="ok", samples_per_sec_median=rates[c.entry] * (1 + 0.01 * rung))
    return measure, calls


def test_halving_keeps_the_best_third_and_picks_the_far_better_value():
    text = "horovod[cycle_time_ms=0.1|0.5|2|5|10,fusion_threshold_mb=128,fp16_allreduce=false,num_groups=0]"
    cands = space.candidates("horovod", space.parse_space(text)["horovod"], ARGS)[1:]
    rates = {c.entry: 10_000 / float(dict(c.variant.settings)["cycle_time_ms"]) for c in cands}
    measure, calls = _measured(rates)
    finalists, trials, stopped = search.halve(cands, measure, 100)
    assert [c.entry for c in finalists] == ["horovod:sync[cycle_time_ms=0.1]"] and stopped is None
    assert [(rung, steps) for _, rung, steps in calls] == [(0, 100)] * 5 + [(1, 300)] * 2
    # the budget ends it after three trials: each kind's best so far goes on
    measure, calls = _measured({**rates, "horovod:sync[cycle_time_ms=0.1]": 1.0}, budget_after=3)
    finalists, trials, stopped = search.halve(cands, measure, 100)
    assert [c.entry for c in finalists] == ["horovod:sync[cycle_time_ms=0.5]"] and stopped == "no time left"


def _final(tta, rate, acc=0.95):
    return RunRow(run_dir="x", status="ok", time_to_target=tta, samples_per_sec_median=rate, final_test_accuracy=acc)


def test_finalists_that_train_differently_are_judged_by_time_to_accuracy():
    ps = space.candidates("ps", space.parse_space("ps[num_ps=1]")["ps"], ARGS)
    async_, sync, backup = ps
    # async is fastest per sample but slowest to the target: time to accuracy decides
    best, how = search.best_of([(async_, _final(9.0, 9000)), (sync, _final(5.0, 6000)), (backup, _final(None, 7000))], async_)
    assert best[0] == sync and how == search.BY_TIME
    # times within TIME_TIE of each other are a tie (an evaluation's granularity, the noise): throughput breaks it
    best, _ = search.best_of([(async_, _final(5.5, 9000)), (sync, _final(5.0, 6000))], async_)
    assert best[0] == async_
    # one arithmetic: throughput, but not at the cost of the accuracy
    horovod = space.candidates("horovod", space.parse_space(HOROVOD_CYCLES)["horovod"], ARGS)
    best, how = search.best_of([(horovod[0], _final(None, 3000, 0.93)), (horovod[1], _final(None, 5000, 0.80))],
                               horovod[0])
    assert best[0] == horovod[0] and how == "throughput, accuracy held"


def _first_eval_final(tta, rate, first_acc):
    """A final that evaluated first at update 44 with ``first_acc`` (the target is 0.9), then reached it
    at its fourth evaluation if not at its first."""
    evals = (Eval(type="eval", global_step=44, wall_time=1.0, accuracy=first_acc),
             *(Eval(type="eval", global_step=44 * k, wall_time=1.0 + 0.2 * k, accuracy=0.85) for k in (2, 3)),
             Eval(type="eval", global_step=176, wall_time=2.0, accuracy=0.95))
    return replace(_final(tta, rate), target_accuracy=0.9, curves=Curves(evals=evals))


def test_a_race_to_the_first_evaluation_is_judged_by_throughput():
    """Every run at its target by its first evaluation: the time to it says when each first evaluated (a
    PS job's start-up against a ring's), so throughput decides, in the verdict and among finalists."""
    ps = space.candidates("ps", space.parse_space("ps[num_ps=1]")["ps"], ARGS)
    async_, sync = ps[0], ps[1]
    fast, slow = _first_eval_final(0.9, 23_000, 0.93), _first_eval_final(0.6, 7_000, 0.92)
    ranked, how = search.verdict([("ps", slow), ("mpi", fast)])
    assert [m for m, _ in ranked] == ["mpi", "ps"] and how == search.FIRST_EVAL
    best, how = search.best_of([(async_, slow), (sync, fast)], async_)
    assert best[0] == sync and how == "throughput, accuracy held"
    # one of them crossed later: the time measures training, and ranks
    later = _first_eval_final(1.9, 23_000, 0.85)
    ranked, how = search.verdict([("mpi", later), ("ps", slow)])
    assert [m for m, _ in ranked] == ["ps", "mpi"] and how == search.BY_TIME


@pytest.mark.parametrize("rungs, full, steps", [
    ((300, 300, 900), 110, 900),      # the MLP's 5 epochs are shorter than the last rung: the final runs 900
    ((300,), 110, 300),
    ((300, 900), 5000, None),         # a full length longer than any trial is kept
    ((), 110, None),                  # no halving ran: the flags' length
])
def test_the_final_runs_at_least_the_last_rung(rungs, full, steps):
    from hvdps.tune.tuner import MethodTuned, final_steps
    header = Header(type="header", backend="mpi", mode="sync", world_size=2, plan={"worker_steps": full})
    m = MethodTuned("mpi", (), probe=RunRow(run_dir="x", status="ok", curves=Curves(header=header)))
    trials = [search.Trial(i, n, None, 1.0) for i, n in enumerate(rungs)]
    assert final_steps([m], trials) == {"mpi": steps}


def test_a_plain_comparison_is_told_horovod_s_cycle_time_on_the_mlp():
    """The report's hint: Horovod at its 1 ms cycle on 1 ms steps, the model predicts more at 0.1 ms."""
    found = hints([probe(), probe(backend="mpi", step_s=1.3e-3)])
    assert [(h.method, h.setting, h.value) for h in found] == [("horovod", "cycle_time_ms", "0.1")]
    [line] = [x for x in hint_lines(found) if x]
    assert "predicts" in line and "cycle_time_ms=0.1" in line and "--backends 'horovod,horovod:sync[cycle_time_ms=0.1]'" in line
    assert "hvdps tune --workers 2 --backends horovod" in line
    assert not hints([probe(step_s=50e-3, compute_s=49e-3)])        # a 50 ms step: a cycle is noise


def _tune_argv(out, budget=400):
    return [os.path.join(BIN, "hvdps"), "tune", "--workers", "2", "--model", "mlp", "--batch_size", "4",
            "--backends", HOROVOD_CYCLES, "--budget", str(budget), "--repeat", "2", "--trial_steps", "200",
            "--precision", "float32", "--no_progress", "--out", str(out)]   # the cycle time alone: no precision axis


def _wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    pytest.fail(f"no {what} within {timeout} s")


def _ours_alive(out):
    r = subprocess.run(["pgrep", "-f", str(out)], capture_output=True, text=True)
    return [p for p in r.stdout.split() if int(p) != os.getpid()]


@pytest.mark.process
def test_a_tune_stopped_mid_trial_resumes_and_picks_the_far_better_cycle_time(tmp_path):
    """A tune of Horovod's cycle (0.1 ms, 10 ms and its 1 ms default, on steps of about a millisecond):
    stopped by a signal while its first final run trains, nothing of it is left running; --resume
    reads the finished probe back (its folder untouched) and ends with 0.1 ms as Horovod's best."""
    out = tmp_path / "tune"
    p = subprocess.Popen(_tune_argv(out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                         env=env(), start_new_session=True)
    try:
        probe_done = out / "trials" / "probe" / "horovod-sync-w2" / "trial.json"
        _wait_for(probe_done.exists, 120, "finished probe")
        # the 10 ms cycle pruned, 0.1 ms alone of its kind: straight to the final, beside the defaults
        final = out / "final" / "runs" / "horovod-sync-w2-r1" / "metrics.jsonl"
        _wait_for(final.exists, 120, "final run")
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
    assert p.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "hvdps tune --resume --out" in err and "Traceback" not in err
    _wait_for(lambda: not _ours_alive(out), 20, "end of the stopped tune's processes")
    before = probe_done.stat().st_mtime_ns, (probe_done.parent / "metrics.jsonl").stat().st_ino
    r = subprocess.run([os.path.join(BIN, "hvdps"), "tune", "--resume", "--no_progress", "--out", str(out)],
                       capture_output=True, text=True, cwd=REPO, env=env(), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (probe_done.stat().st_mtime_ns, (probe_done.parent / "metrics.jsonl").stat().st_ino) == before
    assert "[probe]" not in r.stderr                                        # the finished probe is not rerun
    report = (out / "report.md").read_text()
    assert "| Horovod | cycle_time_ms=0.1 |" in report, report
    assert "horovod:sync[cycle_time_ms=10]: pruned" in report
    assert (out / "tune.png").read_bytes()[:4] == b"\x89PNG" and (out / "final" / "report.md").exists()
    best = (out / "best" / "winner.sh").read_text()
    assert "--backends 'horovod:sync[cycle_time_ms=0.1]'" in best and "--cycle_time_ms 0.1" in best
    assert "horovod:sync[cycle_time_ms=0.1] --workers 2" in (out / "best" / "winner.sbatch").read_text()
    assert "kind: MPIJob" in (out / "best" / "winner.yaml").read_text()
    # the report again from the folder, into another: the same verdict, nothing rerun
    again = tmp_path / "again"
    r = subprocess.run([os.path.join(BIN, "hvdps"), "tune", "--from", str(out), "--out", str(again)],
                       capture_output=True, text=True, cwd=REPO, env=env(), timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| Horovod | cycle_time_ms=0.1 |" in (again / "report.md").read_text()
    assert not (again / "trials").exists()
    # for a cluster of 64 workers on 25 Gbit/s: the finals replayed there, best/ for 64 (hvdps/tune/scale.py)
    big = tmp_path / "big"
    r = subprocess.run([os.path.join(BIN, "hvdps"), "tune", "--from", str(out), "--out", str(big), "--for_workers", "64",
                        "--bandwidth_gbps", "25", "--latency_us", "10"],
                       capture_output=True, text=True, cwd=REPO, env=env(), timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    report = (big / "report.md").read_text()
    assert "## For 64 workers on 25 Gbit/s links, 10 us latency" in report
    assert re.search(r"\| horovod \| Horovod \[cycle_time_ms=0\.1\] \| [\d,]+ \| [\d.]+ \| [\d,]+ \| 1 \|", report), report
    assert "--workers 64" in (big / "best" / "winner.sh").read_text()
    assert "--workers 64}" in (big / "best" / "winner.sbatch").read_text()
    assert not (big / "trials").exists()
    state = json.loads((out / "tune.json").read_text())
    assert "--budget" not in state["argv"] and HOROVOD_CYCLES in state["argv"]


@pytest.mark.parametrize("flags, asked, added", [
    ({"avx2"}, "auto", []),                                     # bfloat16 would be emulated: never a candidate
    ({"avx2", "avx512_bf16"}, "auto", ["mixed_bfloat16"]),      # native, though auto keeps float32
    ({"avx2", "avx512_bf16", "amx_bf16"}, "auto", ["float32"]), # auto took bfloat16: float32 beside it
    ({"avx2", "avx512_bf16"}, "float32", []),                   # the flag names one: kept as it is
])
def test_precision_is_an_axis_of_every_method_where_the_hardware_computes_it(flags, asked, added):
    """The defaults again in each policy the hardware computes natively, as an arithmetic of its own
    (judged by time to the target), in a folder of its own (its run's name is its method's)."""
    from common.spec.precision import Hardware
    from hvdps.tune.trials import Trials
    cands = space.candidates("mpi", space.parse_space("mpi")["mpi"], ARGS)
    out = space.precision_candidates(cands, asked, Hardware("cpu", frozenset(flags)))
    assert out[:len(cands)] == cands and [c.precision for c in out[len(cands):]] == added
    for c in out[len(cands):]:
        assert c.variant == cands[0].variant and c.group == (("precision", c.precision),)
        assert c.label.endswith(f" in {c.precision}") and c.argv == ["--precision", c.precision]
        trials = Trials("/t", lambda p=None: f"mlp {p or 'float32'}", 2, ["--model", "mlp"])
        planned, base = trials.plan(c, "final"), trials.plan(cands[0], "final")
        assert planned.run_dir != base.run_dir and "--precision" not in base.cmd
        assert "--precision" in planned.cmd and c.precision in planned.cmd


@pytest.mark.parametrize("flags, error", [
    ({"for_workers": 64}, "give all three"),
    ({"for_workers": 64, "bandwidth_gbps": 25.0}, "give all three"),
    ({"bandwidth_gbps": 25.0, "latency_us": 10.0}, "give all three"),
    ({"for_workers": 64, "bandwidth_gbps": float("nan"), "latency_us": 10.0}, "bandwidth"),
])
def test_the_cluster_a_tune_is_for_is_named_whole(flags, error):
    from hvdps.commands import tune as tune_command
    from common.base.errors import UsageError
    args = argparse.Namespace(**{"for_workers": None, "bandwidth_gbps": None, "latency_us": None, **flags})
    with pytest.raises(UsageError, match=error):
        tune_command.target_of(args)


def test_a_target_s_network_and_words():
    from hvdps.commands import tune as tune_command
    target = tune_command.target_of(argparse.Namespace(for_workers=64, bandwidth_gbps=25.0, latency_us=10.0))
    assert target.said == "64 workers on 25 Gbit/s links, 10 us latency"
    net = target.net.get("any network a cost model names")
    assert (net.bandwidth, net.alpha) == (pytest.approx(25e9 / 8), pytest.approx(10e-6))


@pytest.mark.parametrize("best, measured, alone, said", [
    ("b", "a", True, "was ranked first by the projection alone"),
    ("a", "a", False, "best at the tune's size and at the target"),
])
def test_the_report_says_which_best_the_measurement_did_not_check(best, measured, alone, said):
    from hvdps.tune import scale
    cands = {n: space.Candidate(variant=_variant(v)) for n, v in (("a", "1"), ("b", "0.1"))}
    ranked = tuple(scale.AtTarget(candidate=cands[n], measured_rate=1000.0, step_s=0.004 if n == best else 0.005,
                                  rate=0.0, replayed_from=f"run-{n}") for n in (best, "a" if best == "b" else "b"))
    m = scale.MethodAtTarget(method="horovod", ranked=ranked, best=cands[best], measured_best=cands[measured])
    assert m.by_projection_alone is alone
    text = "\n".join(scale.section([m], scale.Target(64, 25.0, 10.0)))
    assert said in text and "## For 64 workers on 25 Gbit/s links" in text


def _variant(cycle):
    from hvdps.methods import Variant
    return Variant("horovod", "sync", settings=(("cycle_time_ms", cycle),))
