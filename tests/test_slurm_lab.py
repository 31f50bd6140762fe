"""The emulated SLURM lab's task prolog (hvdps/measure/slurm_lab.py): every task's Open MPI files go
to folders of this lab alone, so two labs at once (the README walk-through beside tests/test_slurm.py)
never share a session folder or a shared-memory segment. The lab itself runs in tests/test_slurm.py."""
import os
import subprocess
import socket
import types

import pytest

from hvdps.measure.slurm_lab import SHM, SlurmLab, shm_dir


@pytest.mark.process
def test_the_task_prolog_gives_each_lab_its_own_open_mpi_folders(tmp_path):
    lab = SlurmLab(types.SimpleNamespace(count=2))
    assert lab.shm == shm_dir(os.getpid()) and lab.shm.startswith(SHM + "/")   # the segments stay on tmpfs
    assert shm_dir(os.getpid()) != shm_dir(os.getpid() + 1)
    folders = {}
    for name in ("a", "b"):                  # two labs: the same host names, other folders
        lab.dir, lab.shm = str(tmp_path / name / "lab"), str(tmp_path / name / "shm")
        prolog = tmp_path / f"{name}.sh"
        prolog.write_text(lab.task_prolog())
        r = subprocess.run(["sh", str(prolog)], capture_output=True, text=True, timeout=30,
                           env=dict(os.environ, SLURMD_NODENAME="elsewhere"))
        assert r.returncode == 0 and not r.stderr, r.stderr
        exports = dict(line.removeprefix("export ").split("=", 1) for line in r.stdout.splitlines())
        host = socket.gethostname()          # the node's own name, not the batch step's SLURMD_NODENAME
        assert exports == {"OMPI_MCA_orte_tmpdir_base": f"{lab.dir}/tmp/{host}/ompi",
                           "OMPI_MCA_btl_vader_backing_directory": f"{lab.shm}/{host}"}, r.stdout
        assert all(os.path.isdir(path) for path in exports.values())
        folders[name] = set(exports.values())
    assert not folders["a"] & folders["b"]
