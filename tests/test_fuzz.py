"""Property-based tests: generated files and flag values, the promise asserted on each.

Tables list the inputs somebody thought of; these generate the rest: truncated, wrong-typed,
huge, deeply nested and non-finite files for every reader, and flag values drawn from each
entry point's own parser for every parser. On each input the promise is: it is taken, or it is
refused with one ``error:`` line (exit 2), never a traceback; within a bounded time; and no
file outside the test's own folder is written.

The unit tier runs the ``unit`` profile (derandomized: the same examples every run, a few dozen
per property); ``make fuzz`` runs the ``fuzz`` profile (thousands, a new seed each time) and
prints Hypothesis' statistics. The profiles are registered in tests/conftest.py.
"""
import contextlib
import io
import json
import math
import os
import signal
import string

from unittest import mock

import pytest
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from common.formats import schemas
from common.base.errors import UsageError

# ------------------------------------------------------------------ bounded time
SECONDS = 20        # one example; an infinite loop (a NaN in a schedule) fails here, not at CI's limit


@contextlib.contextmanager
def bounded(seconds=SECONDS):
    def stop(*_):
        raise TimeoutError(f"an example ran past {seconds} s")
    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def one_line(exc):
    text = str(exc)
    assert text and "\n" not in text and "Traceback" not in text, repr(text)
    event("refused")


def call_main(main, argv):
    """An entry point's main() in-process, bounded: (exit code, what it wrote to stderr)."""
    err = io.StringIO()
    with bounded(), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv) or 0
        except SystemExit as exc:
            code = exc.code
    return code, err


def run_main(main, argv):
    """An entry point's main() in-process: (exit code, stderr). Its @cli turns a UsageError into one
    line and exit 2; anything else escapes and fails the example with its traceback."""
    code, err = call_main(main, argv)
    lines = [l for l in err.getvalue().splitlines() if l.strip() and not l.startswith(("note:", "warning:"))]
    event("refused" if code else "taken")
    if code:
        assert code == 2, (code, err.getvalue())
        assert len(lines) == 1 and lines[0].startswith("error: "), err.getvalue()
    assert "Traceback" not in err.getvalue(), err.getvalue()
    return code, err.getvalue()


# ------------------------------------------------------------------ values
NASTY_NUMBERS = st.sampled_from([0, -1, -0.0, 1e-300, 1e300, 2 ** 63, -(2 ** 63), 2 ** 70, 1e16, 0.5, 7.5, 65536,
                                 float("nan"), float("inf"), -float("inf")])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2 ** 80, max_value=2 ** 80),
                    st.floats(allow_nan=True, allow_infinity=True), NASTY_NUMBERS,
                    st.text(max_size=12), st.sampled_from(["", " ", "nan", "1e999", "3", "-1", "fast"]))
JSON = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                    max_leaves=20)


def dumps(value):
    """JSON text; non-finite floats come out as NaN / Infinity / 1e999, as other tools write them."""
    text = json.dumps(value, allow_nan=True)
    return text.replace("-Infinity", "-1e999") if "Infinity" in text and "-Infinity" in text else text


def paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from paths(v, prefix + (i,))


def replaced(doc, path, value):
    if not path:
        return value
    doc = json.loads(json.dumps(doc))
    node = doc
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return doc


def _at(doc, path):
    for p in path:
        doc = doc[p]
    return doc


@st.composite
def broken(draw, valid):
    """A valid document with one part replaced (a wrong type or a bad value), dropped (a missing field),
    added (an extra field), or the text cut short / nested / doubled."""
    how = draw(st.sampled_from(["replace", "replace", "replace", "drop", "extra", "truncate", "nest", "junk"]))
    if how == "junk":
        return draw(st.one_of(st.binary(max_size=64), JSON.map(dumps)))
    if how == "nest":
        depth = draw(st.integers(min_value=1, max_value=3000))
        return "[" * depth + json.dumps(valid) + "]" * depth
    if how == "truncate":
        text = json.dumps(valid)
        return text[:draw(st.integers(min_value=0, max_value=len(text) - 1))]
    if how == "extra":
        objects = [p for p in paths(valid) if isinstance(_at(valid, p), dict)]
        if objects:
            where = draw(st.sampled_from(objects))
            doc = json.loads(json.dumps(valid))
            node = _at(doc, where) if where else doc
            node[draw(st.sampled_from(["extra", "Loss", "samples_seen ", "", "type"]))] = draw(JSON)
            return dumps(doc)
    path = draw(st.sampled_from(list(paths(valid))))
    if how == "drop" and path:
        parent = json.loads(json.dumps(valid))
        node = parent
        for p in path[:-1]:
            node = node[p]
        del node[path[-1]]
        return dumps(parent)
    return dumps(replaced(valid, path, draw(JSON)))


def write(folder, name, content):
    path = os.path.join(folder, name)
    with open(path, "wb") as f:
        f.write(content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass"))
    return path


# ------------------------------------------------------------------ every reader
from tests.test_schemas import CLUSTER, COMM, LAUNCH, LINKS, LOAD, METRIC, PROFILES, RUN  # noqa: E402

RECORD_SET = {"layout": "plain", "shape": [2, 3, 1], "dtype": "float32", "classes": 5, "first_label": 0,
              "train": {"files": ["train-00000-of-00001.tfrecord"], "records": [40]},
              "test": {"files": ["test-00000-of-00001.tfrecord"], "records": [10]}}
READERS = [(schemas.read_record_set, RECORD_SET), (schemas.read_comm, COMM), (schemas.read_cluster_description, CLUSTER),
           (schemas.read_links_spec, CLUSTER), (schemas.read_links, LINKS), (schemas.read_load, LOAD), (schemas.read_run_record, RUN),
           (schemas.read_launch_record, LAUNCH), (schemas.read_profiles, PROFILES)]


@pytest.mark.parametrize("reader, valid", READERS, ids=lambda x: getattr(x, "__name__", ""))
@given(data=st.data())
def test_every_reader_takes_or_refuses_in_one_line(tmp_path_factory, reader, valid, data):
    folder = str(tmp_path_factory.mktemp("r"))
    content = data.draw(broken(valid))
    path = write(folder, "f.json", content)
    with bounded():
        try:
            reader(path)
        except UsageError as exc:
            one_line(exc)
            assert str(exc).startswith(path), exc


# A PS run's records with the fields ps_train/records.py declares, read with the registry's fields
PS_METRIC = [dict(METRIC[0], backend="ps", tasks={"ps": 1}, ps_shard_bytes={"ps:0": 4000},
                  placement={"dense/kernel": ["/job:ps/task:0"]}),
             dict(METRIC[1], worker_steps=[5, 5], sync_wait_total_s=[0.1, 0.2], lost_workers=[]),
             METRIC[2], dict(METRIC[3], dropped_gradients=3, worker_steps=[9, 10])]


@pytest.mark.parametrize("metric, method_fields", [(METRIC, False), (PS_METRIC, True)], ids=["shared", "ps"])
@given(data=st.data())
def test_metrics_reader_takes_or_refuses_each_record(tmp_path_factory, metric, method_fields, data):
    from hvdps.methods import record_fields
    index = data.draw(st.integers(min_value=0, max_value=len(metric) - 1))
    folder = str(tmp_path_factory.mktemp("m"))
    records = [json.dumps(r) for r in metric]
    records[index] = data.draw(broken(metric[index]))
    records[index] = records[index].decode("latin-1") if isinstance(records[index], bytes) else records[index]
    path = write(folder, "metrics.jsonl", "\n".join(r.replace("\n", " ") for r in records) + "\n")
    with bounded():
        try:
            got = schemas.read_metrics(path, record_fields() if method_fields else None)
        except UsageError as exc:
            one_line(exc)
            return
    for rec in (r.model_dump() for r in got):       # what passes is what the schema says: finite, in range
        for key in ("accuracy", "final_test_accuracy"):
            assert rec.get(key) is None or 0 <= rec[key] <= 1
        assert all(not isinstance(v, float) or math.isfinite(v) for v in rec.values())
    headers = [r for r in got if r.type == "header"]
    if method_fields and headers and headers[-1].backend == "ps":     # the method's fields typed too
        for r in got:
            counts = getattr(r, "worker_steps", None) or []
            assert all(type(c) is int and c >= 0 for c in counts), r
            assert getattr(r, "dropped_gradients", None) is None or type(r.dropped_gradients) is int


@given(data=st.data())
def test_config_reader_takes_or_refuses(tmp_path_factory, data):
    from common.spec.config import make_config
    folder = str(tmp_path_factory.mktemp("c"))
    valid = make_config(batch_size=16).to_dict()
    path = write(folder, "config.json", data.draw(broken(valid)))
    with bounded():
        try:
            schemas.read_config(path)
        except UsageError as exc:
            one_line(exc)


HOSTFILE_LINE = st.one_of(st.text(max_size=30), st.sampled_from(
    ["node1 slots=2", "node2", "node1 slots=0", "n slots=99999", "n max_slots=1 slots=2", "[::1] slots=1",
     "a..b", "-bad", "n slots=2 slots=3", "n foo=1", "# comment", "n\tslots=4"]))


@given(lines=st.lists(HOSTFILE_LINE, max_size=6))
def test_hostfile_reader_takes_or_refuses(tmp_path_factory, lines):
    from common.launch.hosts import parse_hostfile
    path = write(str(tmp_path_factory.mktemp("h")), "hostfile", "\n".join(lines))
    with bounded():
        try:
            hosts = parse_hostfile(path)
        except UsageError as exc:
            one_line(exc)
            return
    assert hosts and all(1 <= s <= 4096 for _, s in hosts)


@given(data=st.data())
def test_cluster_spec_and_tf_config_take_or_refuse(tmp_path_factory, data):
    from tf_cluster.spec import parse_cluster_spec, parse_tf_config
    valid = {"cluster": {"ps": ["h1:2222"], "worker": ["h2:2222", "h3:2222"]}, "task": {"type": "worker", "index": 1}}
    text = data.draw(broken(valid))
    text = text.decode("latin-1") if isinstance(text, bytes) else text
    path = write(str(tmp_path_factory.mktemp("s")), data.draw(st.sampled_from(["c.json", "c.yaml"])), text)
    with bounded():
        for read in (lambda: parse_cluster_spec(path), lambda: parse_tf_config(text)):
            try:
                read()
            except UsageError as exc:
                one_line(exc)


@given(value=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e39, -1e300, 3.4e38])),
       at=st.integers(min_value=0, max_value=15))
def test_data_arrays_beyond_float32_are_refused_at_load(value, at):
    import numpy as np
    from common.inputs.data import check_arrays
    x = np.zeros((4, 4))
    x.flat[at] = value
    y = np.zeros(4, dtype=np.int64)
    try:
        out = check_arrays((x, y, x, y), "plugin")
    except UsageError as exc:
        one_line(exc)
        assert not math.isfinite(value) or abs(value) > float(np.finfo(np.float32).max)
        return
    assert np.isfinite(out[0]).all()


# ------------------------------------------------------------------ every entry point's parser
TEXT = st.text(alphabet=string.ascii_letters + string.digits + ",._- ", max_size=12)   # no "/" or ":": stays here
VALUE = st.one_of(TEXT, st.sampled_from(["", " ", "nan", "inf", "-inf", "1e999", "-1", "0", "-0", "1e15", "2e15",
                                         "99999999999999999999", "3", "0.5", "1,2", "true", "nosuchmodule:f"]),
                  st.integers(min_value=-10, max_value=10 ** 7).map(str),
                  st.floats(allow_nan=True, allow_infinity=True).map(repr))
# Flags that reach beyond this process (hosts, shells, other runs' folders) or replace the whole run:
# their values are exercised by the tables in tests/test_cli.py.
AWAY = {"--hosts", "--rsh", "--links", "--from", "--resume", "--help", "--data_dir", "--comm-json",
        "--out", "--train_dir", "--dry-run", "--cleanup", "--sbatch"}


def flag_argv(parser, data):
    """Flags of ``parser`` with generated values: a choice or a valid-looking value half the time."""
    actions = [a for a in parser._actions if a.option_strings and not set(a.option_strings) & AWAY]
    chosen = data.draw(st.lists(st.sampled_from(actions), max_size=4, unique_by=id))
    argv = []
    for action in chosen:
        flag = action.option_strings[-1]
        if action.nargs == 0:
            argv.append(flag)
        elif action.choices:
            argv += [flag, data.draw(st.one_of(st.sampled_from(list(action.choices)), VALUE))]
        else:
            argv += [flag, data.draw(VALUE)]
    return argv


def trainer_parsers():
    from common.spec.config import build_parser
    from horovod_train.backend import add_horovod_args
    from mwms_train.backend import add_mwms_args
    from ps_train.main import make_parser as ps_parser
    return {"horovod": lambda: add_horovod_args(build_parser("t")), "mpi": lambda: build_parser("t"),
            "mwms": lambda: add_mwms_args(build_parser("t")), "ps": ps_parser}


@pytest.mark.parametrize("name", ["horovod", "mpi", "mwms", "ps"])
@given(data=st.data())
def test_trainer_flags_are_taken_or_refused_in_one_line(name, data):
    from common.spec.config import from_args
    parser = trainer_parsers()[name]()
    argv = flag_argv(parser, data)
    with bounded():
        try:
            from_args(parser.parse_args(argv))
        except UsageError as exc:
            one_line(exc)


@pytest.mark.parametrize("module", ["ps_train.launch", "mwms_train.launch", "hvdps.commands.emulate"])
@given(data=st.data())
def test_launcher_flags_are_taken_or_refused_in_one_line(module, data):
    import importlib
    mod = importlib.import_module(module)
    argv = flag_argv(mod.make_parser(), data)
    with bounded():
        try:
            (mod.parse_args if hasattr(mod, "parse_args") else mod.make_parser().parse_args)(argv)
        except UsageError as exc:
            one_line(exc)


@given(data=st.data())
def test_compare_dry_run_takes_or_refuses_every_flag(tmp_path_factory, monkeypatch, data):
    from hvdps.commands import compare
    folder = str(tmp_path_factory.mktemp("cmp"))
    monkeypatch.chdir(folder)
    argv = flag_argv(compare.make_parser(), data)
    assume("--workers" not in argv or len(argv) < 8)
    before = set(os.listdir(folder))
    run_main(compare.main, [*argv, "--dry-run", "--out", os.path.join(folder, "out")])
    assert set(os.listdir(folder)) <= before | {"out"}


@given(data=st.data())
def test_projection_takes_or_refuses_every_flag(tmp_path_factory, data):
    from hvdps.commands import project as projection
    folder = str(tmp_path_factory.mktemp("prj"))
    base = ["--bandwidth-gbps", "10", "--latency-us", "20", "--model-params", "25", "--step-compute-ms", "100",
            "--max-workers", "64"]
    argv = flag_argv(projection.make_parser(), data)
    code, _ = run_main(projection.main, [*base, *argv, "--out", os.path.join(folder, "p")])
    assert set(os.listdir(folder)) <= {"p"}
    if code == 0:
        rows = schemas.parse_json(open(os.path.join(folder, "p", "projection.json")).read(), "projection.json")
        assert rows


@given(data=st.data())
def test_projection_from_any_comm_file_ends_in_time(tmp_path_factory, data):
    """A comm.json that passes its schema still has to give an answer or one line, in bounded time:
    fits from extreme but finite times must not loop or overflow."""
    from hvdps.commands import project as projection
    folder = str(tmp_path_factory.mktemp("cj"))
    rows = data.draw(st.lists(st.fixed_dictionaries({
        "impl": st.sampled_from(["horovod-mpi", "mwms", "ps-push", "ps-pull"]),
        "bytes": st.one_of(st.integers(min_value=1, max_value=2 ** 40), st.floats(min_value=1, max_value=2.0 ** 50)),
        "seconds": st.floats(min_value=1e-9, max_value=1e6)}), min_size=1, max_size=8))
    comm = write(folder, "comm.json", json.dumps({"np": data.draw(st.integers(min_value=2, max_value=65536)),
                                                  "results": rows}))
    run_main(projection.main, ["--comm-json", comm, "--model-params", "25", "--step-compute-ms", "100",
                               "--max-workers", "64", "--out", os.path.join(folder, "p")])


class Clock:
    """A clock that moves 1 ms a reading from a fixed start: records whose times (and so whose text)
    are the same in every example."""

    def __init__(self):
        self.now = 1_800_000_000.0

    def _tick(self):
        self.now += 0.001
        return self.now

    time = monotonic = perf_counter = _tick


@settings(max_examples=max(12, settings.default.max_examples // 4))    # each example writes a report and plots
@given(data=st.data())
def test_a_broken_recorded_run_is_reported_or_refused_past_the_reader(tmp_path_factory, data):
    """hvdps compare --from and hvdps project --from on a recorded run with one record broken (a field
    missing, added or of another type, a bad value, a cut line): a report, or one error line, never a
    traceback from the code that reads what the reader let through."""
    from common.spec import plugins
    from hvdps.commands import compare, project
    from tests.test_compare import fake_run
    folder = tmp_path_factory.mktemp("from")
    run_dir = folder / "runs" / "horovod-sync-w2"
    with mock.patch("common.trainer.metrics.time", Clock()):     # the same records each time: Hypothesis replays draws
        fake_run(run_dir, "horovod", "sync", 2, [100.0, 110.0, 120.0], [0.5, 0.95])
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    i = data.draw(st.integers(min_value=0, max_value=len(lines) - 1))
    bad = data.draw(broken(json.loads(lines[i])))
    lines[i] = (bad.decode("latin-1") if isinstance(bad, bytes) else bad).replace("\n", " ")
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    budget = plugins._budget                     # each bounds its plug-ins for its own life: kept as it was
    try:
        for main, argv in ((compare.main, ["--from", str(folder / "runs"), "--out", str(folder / "cmp")]),
                           (project.main, ["--from", str(folder / "runs"), "--bandwidth_gbps", "10", "--latency_us",
                                           "5", "--out", str(folder / "proj")])):
            code, err = call_main(main, argv)
            errors = [l for l in err.getvalue().splitlines() if l.startswith("error:")]
            assert "Traceback" not in err.getvalue(), err.getvalue()
            assert code in (0, 1) or (code == 2 and len(errors) == 1), (code, err.getvalue())
            event(f"{main.__module__}: exit {code}")
    finally:
        plugins._budget = budget


# ------------------------------------------------------------------ TFRecord files: the first record of each
def _framed(data):
    """``data`` as one TFRecord record with valid length and data CRCs."""
    import struct

    from common.inputs.records import _masked_crc
    head = struct.pack("<Q", len(data))
    return head + struct.pack("<I", _masked_crc(head)) + data + struct.pack("<I", _masked_crc(data))


def _valid_examples():
    import numpy as np

    from common.inputs.records import encode_image
    from tests.test_records import PIXELS, example
    return {"plain": example(x=PIXELS, y=1),
            "imagenet": example(image__encoded=encode_image(np.full((2, 3, 1), 7, np.uint8), "png"),
                                image__class__label=2)}


@pytest.mark.parametrize("layout", ["plain", "imagenet"])
@given(data=st.data())
def test_a_first_record_is_taken_or_refused_in_one_line(tmp_path_factory, layout, data):
    """Mutated valid examples (bytes flipped, cut, inserted), framed as a record with valid CRCs or
    left unframed: the pre-start check takes them or refuses them in one line naming the file."""
    from common.inputs.records import check_example, check_first_record
    valid = _valid_examples()[layout]
    body = bytearray(valid)
    for _ in range(data.draw(st.integers(0, 4))):
        at = data.draw(st.integers(0, max(0, len(body) - 1)))
        how = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if how == "flip" and body:
            body[at] ^= data.draw(st.integers(1, 255))
        elif how == "cut":
            del body[at:]
        else:
            body[at:at] = data.draw(st.binary(min_size=1, max_size=8))
    content = _framed(bytes(body)) if data.draw(st.booleans()) else bytes(body)
    path = write(str(tmp_path_factory.mktemp("tfr")), "train-00000-of-00001", content)
    spec = schemas.RecordSet(**{**RECORD_SET, "layout": layout, "dtype": "uint8" if layout == "imagenet" else "float32",
                                "first_label": 1 if layout == "imagenet" else 0})
    with bounded():
        try:
            check_example(check_first_record(path), spec, f"{path}: record 0")
            event("taken")
        except UsageError as exc:
            one_line(exc)
            assert str(exc).startswith(path), exc
