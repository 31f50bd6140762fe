"""Progress output: a bar only on a terminal the user watches, plain lines everywhere else."""
import io

import pytest

from common.trainer.runlog import Progress


class Tty(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("env, tty, bar", [
    ({}, True, True),                                    # a terminal: tqdm
    ({}, False, False),                                  # a log file, CI
    ({"OMPI_COMM_WORLD_RANK": "0"}, True, False),        # mpirun hands ranks a pty and prefixes lines
    ({"HOROVOD_RANK": "1"}, True, False),                # horovodrun --gloo
    ({"SLURM_PROCID": "0"}, True, False),                # srun
])
def test_bar_only_on_a_terminal_outside_a_launcher(monkeypatch, env, tty, bar):
    for name in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    err = Tty() if tty else io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    p = Progress(total=4, desc="horovod")
    p.update(4, loss=0.5)
    p.close()
    assert (p.bar is not None) == bar
    if not bar:
        assert out.getvalue() == "[horovod] step 4/4 loss=0.5\n"
        assert "\r" not in err.getvalue() + out.getvalue()
