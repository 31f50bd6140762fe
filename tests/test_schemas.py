"""Every file hvdps reads goes through its one reader (common/formats/schemas.py), and each reader holds
its format: types, finite numbers, physical ranges, bounded size and depth, no blocking."""
import ast
import json
import os

import numpy as np
import pytest

from common.formats import schemas
from common.base.errors import UsageError
from tests.conftest import REPO

COMM = {"np": 2, "results": [{"impl": "horovod", "bytes": 1024, "seconds": 0.001},
                             {"impl": "ps-push", "bytes": 1024, "seconds": 0.002}]}
CLUSTER = {"rate": "1gbit", "rate_bps": 1e9, "latency_s": 5e-5, "rtt_s": 1e-4, "counters": "/proc/1/net/dev",
           "ports": {"10.0.0.1": "h1"}, "subnet": "10.0.0.0/24", "namespaces": {"10.0.0.1": "x-h1"}}
LINKS = {"series": {"10.0.0.1": [[1.7e9, 10, 20], [1.7e9 + 1, 30, 40]]}, "roles": {"rank:0": "10.0.0.1"},
         "rate_bps": 1e9}
LOAD = {"hz": 100, "cores": 2, "samples": [[1.7e9, 500, 1000, 100, 3], [1.7e9 + 1, 680, 1200, 180, 4]]}
RUN = {"seconds": 12.5, "launched_at": 1.7e9, "exit_code": 0, "command": ["python", "x.py"], "roles": None}
STALLED = {**RUN, "unhealthy": {"condition": "stall1-1000-250", "what": "w", "rank": 1, "every_ms": 1000, "for_ms": 250,
                                "stops": 2, "stopped_s": 0.5, "stopped_at": [[1.7e9, 1.7e9 + 0.25], [1.7e9 + 1, 1.7e9 + 1.25]]}}
LAUNCH = {"cpu_seconds": {"ps:0": 1.5, "worker:0": 3.0}, "cpu_series": {"ps:0": [[1.7e9, 0.1], [1.7e9 + 1, 0.5]]},
          "exit_code": 0, "ended_by": "workers finished", "restarts": [], "pids": {"ps:0": 12}}
PROFILES = {"tiny": {"layers": [{"name": "dense", "grad_bytes": 400, "flops": 1000}], "input_shape": [8, 8, 1],
                     "classes": 10}}

# (reader, a valid document, a change that breaks it, what the one error line must name)
CASES = [
    (schemas.read_comm, COMM, ("results", 0, "seconds", "__1e999__"), "1e999 overflows to infinity"),
    (schemas.read_comm, COMM, ("results", 0, "seconds", -1.0), "results[0].seconds: input should be greater"),
    (schemas.read_comm, COMM, ("results", 0, "bytes", "1024"), "results[0].bytes: input should be a valid number"),
    (schemas.read_comm, COMM, ("np", 0), "np: input should be greater than or equal to 2"),
    (schemas.read_comm, COMM, ("np", True), "np: input should be a valid integer"),
    (schemas.read_comm, COMM, ("results", []), "results: list should have at least 1 item"),
    (schemas.read_cluster_description, CLUSTER, ("rate_bps", -5), "rate_bps: input should be greater than or equal to 1000"),
    (schemas.read_cluster_description, CLUSTER, ("rate_bps", 1e-300), "rate_bps: input should be greater than or equal to 1000"),
    (schemas.read_cluster_description, CLUSTER, ("latency_s", -1e-6), "latency_s: input should be greater than or equal"),
    (schemas.read_cluster_description, CLUSTER, ("latency_s", "fast"), "latency_s: input should be a valid number"),
    (schemas.read_links_spec, CLUSTER, ("counters", None), "counters: input should be a valid string"),
    (schemas.read_links, LINKS, ("series", "10.0.0.1", 0, [1, 2]), "series.10.0.0.1[0]: list should have at least 3"),
    (schemas.read_links, LINKS, ("series", "10.0.0.1", 1, 1, -30), "greater than or equal to 0"),
    (schemas.read_load, LOAD, ("samples", 1, 0, 1.6e9), "samples: sample 1 is earlier than sample 0"),
    (schemas.read_load, LOAD, ("samples", 1, 1, 400), "samples: sample 1 has a counter below sample 0's"),
    (schemas.read_load, LOAD, ("samples", 0, [1.7e9, 500, 1000]), "samples[0]: list should have at least 5"),
    (schemas.read_load, LOAD, ("hz", 0), "hz: input should be greater than or equal to 1"),
    (schemas.read_run_record, RUN, ("oversubscribed", "yes"), "oversubscribed: input should be a valid boolean"),
    (schemas.read_run_record, RUN, ("seconds", -3), "seconds: input should be greater than or equal to 0"),
    (schemas.read_run_record, RUN, ("launched_at", 1e300), "launched_at: input should be less than or equal"),
    (schemas.read_run_record, STALLED, ("unhealthy", "stopped_at", 0, [1.7e9, 1.7e9 - 1]), "stop 0 ends before it starts"),
    (schemas.read_run_record, STALLED, ("unhealthy", "stopped_at", 1, [1.7e9 + 0.1, 1.7e9 + 0.2]),
     "stop 1 ends before it starts or begins before stop 0 ended"),
    (schemas.read_run_record, STALLED, ("unhealthy", "stopped_at", 0, [1.7e9]), "stopped_at[0]: list should have at least 2"),
    (schemas.read_launch_record, LAUNCH, ("cpu_series", "ps:0", 0, ["a", 1]), "cpu_series.ps:0[0][0]: input should be"),
    (schemas.read_profiles, PROFILES, ("tiny", "layers", 0, "grad_bytes", -4), "tiny: layers[0].grad_bytes"),
]


def put(doc, change):
    doc = json.loads(json.dumps(doc))
    *path, key, value = change
    node = doc
    for p in path:
        node = node[p]
    node[key] = value
    return doc


def write(tmp_path, doc, name="f.json"):
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc).replace('"__1e999__"', "1e999"))
    return str(p)


@pytest.mark.parametrize("reader, doc, change, named", CASES)
def test_reader_takes_the_valid_file_and_refuses_the_broken_one_in_one_line(tmp_path, reader, doc, change, named):
    reader(write(tmp_path, doc, "ok.json"))
    path = write(tmp_path, put(doc, change), "bad.json")
    with pytest.raises(UsageError) as exc:
        reader(path)
    line = str(exc.value)
    assert line.startswith(path + ":") and "\n" not in line and named in line, line


@pytest.mark.parametrize("text, named", [
    ('{"np": NaN, "results": []}', "NaN is not a number JSON allows"),
    ('{"np": 2, "results": [{"impl": "x", "bytes": 1, "seconds": Infinity}]}', "Infinity is not a number"),
    ("[" * 50 + "]" * 50, "nested deeper than 32 levels"),
    ("[" * 100000 + "]" * 100000, "nested deeper than 32 levels"),
    ('{"np": 2, "results": [', "not valid JSON"),
    ("", "not valid JSON"),
    ("[1, 2]", "(top level): input should be a valid dictionary"),
])
def test_parse_refuses_non_finite_deep_and_truncated_json(tmp_path, text, named):
    with pytest.raises(UsageError, match=None) as exc:
        schemas.read_comm(write(tmp_path, text))
    assert named in str(exc.value) and "\n" not in str(exc.value), exc.value


def test_non_utf8_is_one_line(tmp_path):
    p = tmp_path / "c.json"
    p.write_bytes(b'{"np": "\xff\xfe"}')
    with pytest.raises(UsageError, match="not UTF-8 text"):
        schemas.read_comm(str(p))


@pytest.mark.parametrize("reader", [schemas.read_comm, schemas.read_links, schemas.read_load, schemas.read_run_record,
                                    schemas.read_launch_record, schemas.read_metrics, schemas.read_config,
                                    schemas.read_weights])
def test_a_fifo_is_refused_without_blocking(tmp_path, reader):
    fifo = str(tmp_path / "planted")
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="not a regular file|is a FIFO"):
        reader(fifo)


def test_size_is_bounded_before_reading(tmp_path, monkeypatch):
    monkeypatch.setattr(schemas, "MAX_JSON", 1024)
    p = tmp_path / "big.json"
    p.write_text(json.dumps({"np": 2, "results": [COMM["results"][0]] * 100}))
    with pytest.raises(UsageError, match="more than the 0 MiB hvdps reads"):
        schemas.read_json(str(p), schemas.CommFile, "a comm file", max_bytes=schemas.MAX_JSON)


METRIC = [{"type": "header", "backend": "horovod", "mode": "sync", "world_size": 2, "start_time": 1.7e9},
          {"type": "step", "global_step": 10, "samples_seen": 320, "wall_time": 1.0, "loss": 0.5,
           "samples_per_sec": 100.0},
          {"type": "eval", "global_step": 10, "epoch": 1, "accuracy": 0.9, "loss": 0.3, "wall_time": 1.1},
          {"type": "summary", "status": "ok", "total_time": 2.0, "final_test_accuracy": 0.9,
           "throughput": {"median": 100.0, "n": 3, "error": None}}]


def metrics_file(tmp_path, records, tail=""):
    p = tmp_path / "metrics.jsonl"
    p.write_text("".join(json.dumps(r).replace('"__1e999__"', "1e999") + "\n" for r in records) + tail)
    return str(p)


@pytest.mark.parametrize("index, key, value, named", [
    (2, "accuracy", 7.5, "accuracy: input should be less than or equal to 1"),
    (0, "world_size", 0, "world_size: input should be greater than or equal to 1"),
    (0, "world_size", -2, "world_size: input should be greater than or equal to 1"),
    (1, "samples_per_sec", "__1e999__", "a record with a number JSON does not allow"),
    (1, "global_step", "ten", "global_step: input should be a valid integer"),
    (3, "final_test_accuracy", -0.1, "final_test_accuracy: input should be greater than or equal to 0"),
    (3, "throughput", {"median": "fast"}, "throughput.median: input should be a valid number"),
    # sub-records the report and the projection compute with are typed too, not left as dicts
    (3, "breakdown", {"compute_s": True}, "breakdown.compute_s: input should be a valid number"),
    (3, "breakdown", {"exchange_s": [1, 2]}, "breakdown.exchange_s: input should be a valid number"),
    (3, "breakdown", {"step_s": -0.5}, "breakdown.step_s: input should be greater than 0"),
    (3, "wire", {"bytes_per_step_per_worker": "many"}, "wire.bytes_per_step_per_worker: input should be a valid"),
    (3, "gradient", {"dense_bytes": None, "sparse_bytes": {}}, "gradient.sparse_bytes: input should be a valid"),
])
def test_metrics_record_breaking_its_schema_is_refused_by_line(tmp_path, index, key, value, named):
    records = json.loads(json.dumps(METRIC))
    records[index][key] = value
    path = metrics_file(tmp_path, records)
    with pytest.raises(UsageError) as exc:
        schemas.read_metrics(path)
    assert str(exc.value).startswith(f"{path}:{index + 1}: ") and named in str(exc.value), exc.value


@pytest.mark.parametrize("index, key, value, named", [
    (3, "sync_wait_total_s", ["1.5", "2"], "sync_wait_total_s[0]: input should be a valid number"),
    (1, "worker_steps", [3, -1], "worker_steps[1]: input should be greater than or equal to 0"),
    (1, "lost_workers", "worker:1", "lost_workers: input should be a valid list"),
    (0, "ps_shard_bytes", {"ps:0": -8}, "ps_shard_bytes.ps:0: input should be greater than or equal to 0"),
    (3, "dropped_gradients", 1.5, "dropped_gradients: input should be a valid integer"),
    (3, "dropped_gradients", 7, None),                              # a good one: taken, typed
])
def test_a_methods_own_fields_are_typed_with_the_shared_records(tmp_path, index, key, value, named):
    """The fields a method adds to the records (``Method.records``: ps_train/records.py) are checked
    with them, after a header of that method; without the registry's fields (a trainer reading its
    own file), or in another method's run, they are kept as written."""
    from hvdps.methods import record_fields
    records = json.loads(json.dumps(METRIC))
    records[0].update(backend="ps", tasks={"ps": 1})
    records[index][key] = value
    path = metrics_file(tmp_path, records)
    assert getattr(schemas.read_metrics(path)[index], key) == value       # no fields given: kept
    if named is None:
        got = schemas.read_metrics(path, record_fields())[index]
        assert getattr(got, key) == value and type(got).__name__ == "PSSummarySummary"
        assert isinstance(got, schemas.Summary)
        return
    with pytest.raises(UsageError) as exc:
        schemas.read_metrics(path, record_fields())
    assert str(exc.value).startswith(f"{path}:{index + 1}: ") and named in str(exc.value), exc.value
    records[0]["backend"] = "horovod"                                     # another method's run: kept
    path = metrics_file(tmp_path, records)
    assert getattr(schemas.read_metrics(path, record_fields())[index], key) == value


def test_metrics_torn_tail_and_foreign_lines_are_not_records(tmp_path):
    path = metrics_file(tmp_path, METRIC[:2], tail='{"type": "st')
    lines = open(path).read()
    open(path, "w").write('not json\n[1, 2]\n{"no": "type"}\n' + lines)
    assert [r.type for r in schemas.read_metrics(path)] == ["header", "step"]


def test_config_file_is_typed_strictly_and_ranged(tmp_path):
    from common.spec.config import make_config
    cfg = make_config(batch_size=8, image_shape=(8, 8, 1))
    path = tmp_path / "config.json"
    path.write_text(cfg.to_json())
    assert schemas.read_config(str(path)) == cfg
    for change, named in ((("batch_size", "8"), "batch_size: input should be a valid integer"),
                          (("batch_size", -8), "--batch_size must be positive"),
                          (("learning_rate", float("inf")), "Infinity is not a number JSON allows"),
                          (("bogus", 1), "bogus: extra inputs are not permitted"),
                          (("train_dir", ""), "--train_dir must not be empty")):
        d = cfg.to_dict()
        d[change[0]] = change[1]
        path.write_text(json.dumps(d))
        with pytest.raises(UsageError, match=None) as exc:
            schemas.read_config(str(path))
        assert named in str(exc.value), exc.value


def test_weights_reader_refuses_pickles_and_non_numbers(tmp_path):
    good = tmp_path / "w.npz"
    np.savez(good, np.ones(3, np.float32), np.zeros((2, 2)))
    assert [a.shape for a in schemas.read_weights(str(good))] == [(3,), (2, 2)]
    bad = tmp_path / "obj.npz"
    np.savez(bad, np.array([{"a": 1}], dtype=object))
    with pytest.raises(UsageError, match="not a weights file written by hvdps"):
        schemas.read_weights(str(bad))
    (tmp_path / "junk.npz").write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(UsageError, match="not a weights file"):
        schemas.read_weights(str(tmp_path / "junk.npz"))


# ------------------------------------------------------------------ one reader per format
SOURCES = ("common", "allreduce", "tf_cluster", "hvdps", *sorted(e for e in os.listdir(REPO) if e.endswith("_train")),
           "benchmarks", "examples")
# The files of the formats in schemas.READERS, by name or by the constant that names them.
FORMAT_NAMES = {"comm.json", "cluster.json", "links.json", "compare_run.json", "launch.json", "metrics.jsonl",
                "config.json", "model_profiles.json", "weights.npz", "checkpoint", "elastic_job"}
FORMAT_CONSTANTS = {"LINKS_FILE", "RUN_RECORD", "PROFILES"}
READER_MODULES = {"common/formats/schemas.py", "common/base/files.py", "common/launch/hosts.py", "common/inputs/data.py", "common/inputs/records.py"}


def modules():
    """The product's Python files: git's list of them (what another test leaves in the tree while this
    one runs beside it, under pytest-xdist, is not scanned), or the folders' files outside a checkout."""
    import subprocess
    listed = subprocess.run(["git", "ls-files", "-z", "--", *SOURCES], cwd=REPO, capture_output=True)
    if listed.returncode == 0 and listed.stdout:
        paths = [os.path.join(REPO, p) for p in listed.stdout.decode().split("\0") if p.endswith(".py")]
    else:
        paths = [os.path.join(folder, name) for top in SOURCES for folder, _, files in os.walk(os.path.join(REPO, top))
                 for name in files if name.endswith(".py")]
    for path in paths:
        if os.path.exists(path):           # tracked, not deleted in the working tree
            yield os.path.relpath(path, REPO), ast.parse(open(path).read(), path)


def call_name(node):
    f = node.func
    if isinstance(f, ast.Attribute):
        return f"{f.value.id}.{f.attr}" if isinstance(f.value, ast.Name) else f.attr
    return f.id if isinstance(f, ast.Name) else ""


def opens_a_format_file(call):
    for sub in ast.walk(call):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and sub.value in FORMAT_NAMES:
            return True
        if isinstance(sub, ast.Name) and sub.id in FORMAT_CONSTANTS:
            return True
    return False


def offences(path, tree):
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = call_name(node)
        if name == "json.load":
            out.append(f"{path}:{node.lineno}: json.load (read through common/formats/schemas.py)")
        if name in ("open", "np.load", "gzip.open", "read_input", "check_regular", "io.open") and \
                path not in READER_MODULES:
            if name in ("read_input", "check_regular") or opens_a_format_file(node):
                out.append(f"{path}:{node.lineno}: {name} of an input file outside the readers")
    return out


def test_no_module_but_the_readers_opens_an_input_file():
    found = [o for path, tree in modules() for o in offences(path, tree)]
    assert not found, "\n".join(found)


def test_the_scan_catches_what_it_forbids():
    planted = ast.parse('import json\nrec = json.load(open(os.path.join(d, "launch.json")))\n'
                        'text = open(os.path.join(d, LINKS_FILE)).read()\nraw = read_input(p, "x")\n')
    assert len(offences("hvdps/x.py", planted)) == 4


def test_every_format_names_a_reader_that_exists():
    import importlib
    for fmt, dotted in schemas.READERS.items():
        module, _, name = dotted.rpartition(".")
        assert callable(getattr(importlib.import_module(module), name)), fmt
