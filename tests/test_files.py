"""Writes never go through a planted link, never leave half a file and come out 0644 / 0755;
input files that are not regular files are refused before a byte is read."""
import json
import os
import stat
import subprocess
import sys

import pytest

from common.base.errors import UsageError
from common.base.files import WriteError, check_regular, make_dirs, open_append, open_new, read_input, write_atomic
from common.trainer.run_dir import RUN_OUTPUTS
from hvdps.measure.runs import collect, runs_from_dirs
from hvdps.render.report import write_report
from tests.conftest import REPO, env, run, snapshot

HVD = os.path.join(REPO, "horovod_train", "main.py")


@pytest.fixture
def loose_umask():
    old = os.umask(0)
    yield
    os.umask(old)


def plant(path, target):
    os.symlink(target, path)
    return path


@pytest.mark.parametrize("content", ["text", b"\x00bytes", lambda f: f.write(b"from a writer")])
def test_write_atomic_replaces_a_link_and_never_writes_through_it(tmp_path, loose_umask, content):
    target = tmp_path / "outside"
    target.write_text("keep me")
    path = plant(tmp_path / "out.json", target)
    write_atomic(str(path), content)
    assert target.read_text() == "keep me"
    assert not os.path.islink(path) and stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_write_atomic_failure_leaves_nothing(tmp_path):
    def boom(f):
        f.write(b"half")
        raise OSError(28, "No space left on device")
    (tmp_path / "out").write_text("before")
    with pytest.raises(WriteError, match=r"cannot write .*out: No space left on device"):
        write_atomic(str(tmp_path / "out"), boom)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and (tmp_path / "out").read_text() == "before"


@pytest.mark.parametrize("mask, file_mode, dir_mode", [(0o000, 0o644, 0o755), (0o022, 0o644, 0o755),
                                                      (0o077, 0o600, 0o700)])
def test_modes_honour_only_a_stricter_umask(tmp_path, mask, file_mode, dir_mode):
    old = os.umask(mask)
    try:
        make_dirs(str(tmp_path / "a" / "b"))
        write_atomic(str(tmp_path / "a" / "b" / "f"), "x")
        with open_append(str(tmp_path / "a" / "log")) as f:
            f.write("x\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "a").st_mode) == dir_mode
    assert stat.S_IMODE(os.stat(tmp_path / "a" / "b").st_mode) == dir_mode
    assert stat.S_IMODE(os.stat(tmp_path / "a" / "b" / "f").st_mode) == file_mode
    assert stat.S_IMODE(os.stat(tmp_path / "a" / "log").st_mode) == file_mode


def test_append_refuses_a_link_even_a_dangling_one(tmp_path):
    path = plant(tmp_path / "metrics.jsonl", tmp_path / "elsewhere")
    with pytest.raises(UsageError, match="is a symbolic link"):
        open_append(str(path))
    assert not (tmp_path / "elsewhere").exists()


def test_open_new_removes_the_link_not_its_target(tmp_path):
    target = tmp_path / "target"
    target.write_text("keep me")
    path = plant(tmp_path / "run.log", target)
    with open_new(str(path)) as f:
        f.write("log")
    assert target.read_text() == "keep me" and path.read_text() == "log" and not os.path.islink(path)


@pytest.mark.parametrize("kind", ["fifo", "dir", "device", "big"])
def test_inputs_that_are_not_bounded_regular_files_are_refused(tmp_path, kind):
    path = tmp_path / "in"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    elif kind == "big":
        path.write_bytes(b"x" * 2048)
    else:
        path = "/dev/zero"
    with pytest.raises(UsageError, match="not a regular file|more than|is a directory"):
        read_input(str(path), "hostfile", max_bytes=1024)
    with pytest.raises(UsageError):
        check_regular(str(path), "hostfile", max_bytes=1024)


def test_report_replaces_planted_links(tmp_path):
    out = tmp_path / "report"
    out.mkdir()
    target = tmp_path / "target"
    target.write_text("keep me")
    names = ("results.json", "results.csv", "report.md")
    for name in names:
        plant(out / name, target)
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / "metrics.jsonl").write_text(
        json.dumps(dict(type="header", backend="horovod", mode="sync", world_size=1)) + "\n" +
        json.dumps(dict(type="summary", status="ok", throughput={"median": 10.0})) + "\n")
    write_report(collect(runs_from_dirs([str(tmp_path / "ok")])), str(out), {}, {})
    assert target.read_text() == "keep me"
    assert all(not os.path.islink(out / n) and (out / n).stat().st_size > 0 for n in names)


@pytest.mark.process
@pytest.mark.parametrize("name", RUN_OUTPUTS)
@pytest.mark.parametrize("dangling", [False, True])
def test_a_link_planted_at_any_run_output_is_refused(tmp_path, name, dangling):
    """Every fixed name a run writes: a link there (to a file or to nothing) ends the run before it
    starts with one line naming it; the link and its target stay as they were."""
    run_dir = tmp_path / "job"
    os.makedirs(run_dir / os.path.dirname(name), exist_ok=True)
    target = tmp_path / "target"
    if not dangling:
        target.write_text("keep me")
    plant(run_dir / name, target)
    before = snapshot(tmp_path)
    r = run([sys.executable, HVD, "--train_steps", "3", "--train_dir", str(run_dir)], timeout=60)
    assert r.returncode == 2, r.stderr[-2000:]
    assert [l for l in r.stderr.splitlines() if l.startswith("error:")] == \
        [f"error: {run_dir / name} is a symbolic link (to {target}); refusing to write a run's output through it: "
         f"remove it or choose another directory"]
    assert snapshot(tmp_path) == before and (dangling or target.read_text() == "keep me")


@pytest.mark.process
def test_loose_umask_still_gives_0644_files_and_0755_folders(tmp_path):
    """TensorFlow's checkpoints and events included: the trainer raises the umask to 022."""
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, HVD, "--train_steps", "6", "--probe_steps", "2", "--train_dir", str(out)],
                       capture_output=True, text=True, timeout=120, env=env(), cwd=REPO, preexec_fn=lambda: os.umask(0))
    assert r.returncode == 0, r.stderr[-2000:]
    modes = {}
    for folder, dirs, names in os.walk(out):
        for n in dirs + names:
            modes[os.path.join(folder, n)] = stat.S_IMODE(os.lstat(os.path.join(folder, n)).st_mode)
    assert len(modes) >= 7 and all(m & 0o022 == 0 for m in modes.values()), modes
    assert json.loads((out / "config.json").read_text())["train_steps"] == 6


HOLD = ("import sys, time\nfrom common.base.errors import UsageError\nfrom common.base.files import take_folder\n"
        "try:\n    take_folder(sys.argv[1], '--out')\nexcept UsageError as exc:\n    print(exc, flush=True)\n"
        "    sys.exit(2)\nprint('held', flush=True)\ntime.sleep(120)\n")


@pytest.mark.process
def test_a_second_writer_into_a_run_folder_is_refused_and_the_first_loses_nothing(tmp_path):
    """While one hvdps process holds a folder (a comparison's --out, a run's --train_dir) and has
    written nothing there yet, a comparison or a trainer started into it is refused in one line
    before writing anything."""
    busy = tmp_path / "busy"
    busy.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(busy)], stdout=subprocess.PIPE, text=True, cwd=REPO,
                              env=env())
    try:
        assert holder.stdout.readline().strip() == "held"
        before = snapshot(tmp_path)
        for argv in ([os.path.join(os.path.dirname(sys.executable), "hvdps"), "compare", "--backends", "horovod",
                      "--workers", "1", "--train_steps", "5", "--out", str(busy)],
                     [sys.executable, HVD, "--train_steps", "5", "--probe_steps", "0", "--train_dir", str(busy)]):
            r = run(argv, timeout=120)
            errors = [l for l in (r.stdout + r.stderr).splitlines() if l.startswith("error:")]
            assert r.returncode == 2 and len(errors) == 1, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
            assert f"{busy} is in use: another hvdps run is writing there" in errors[0], errors
            assert "Traceback" not in r.stderr
            assert snapshot(tmp_path) == before
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.process
def test_a_folder_taken_twice_by_one_process_stays_taken(tmp_path):
    from common.base.files import take_folder
    take_folder(str(tmp_path), "--train_dir")
    take_folder(str(tmp_path), "--train_dir")            # an elastic job's new rank 0: its own lock, held
    r = subprocess.run([sys.executable, "-c", HOLD, str(tmp_path)], capture_output=True, text=True, cwd=REPO,
                       env=env(), timeout=60)
    assert r.returncode == 2 and "is in use" in r.stdout, r.stdout + r.stderr
