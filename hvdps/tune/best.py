"""best/: each method's best and the winner, each as the command lines that run it (hvdps compare's
entry and its launcher's exact line), an sbatch script (hostfiles/slurm/compare.sbatch with that entry
and these trainer flags as its defaults) and a Kubernetes manifest (hvdps k8s's, checked as it checks
every manifest)."""
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

from common.base.files import make_dirs, write_atomic
from common.base.procs import REPO, child_env
from hvdps.measure.plan import plan_run
from hvdps.measure.identity import RunId, workload_name

SBATCH = os.path.join(REPO, "hostfiles", "slurm", "compare.sbatch")
K8S_TIMEOUT_S = 120
TRAIN_DEFAULT = 'HVDPS_TRAIN_ARGS:-'
COMPARE_DEFAULT = 'HVDPS_COMPARE_ARGS:-'


def _default_replaced(text, var, value):
    """The script with the default of ``${VAR:-...}`` on its read line replaced by ``value``."""
    start = text.index("${" + var)
    end = text.index("}", start)
    return text[:start] + "${" + var + value + text[end:]


def sbatch_of(entry, workers, trainer_args):
    text = open(SBATCH).read()
    text = _default_replaced(text, TRAIN_DEFAULT, " ".join(trainer_args))
    text = _default_replaced(text, COMPARE_DEFAULT, f"--backends {entry} --workers {workers}")
    return text.replace("#SBATCH --job-name=hvdps-compare", "#SBATCH --job-name=hvdps-best", 1)


def commands_of(candidate, workers, trainer_args, workload):
    v = candidate.variant
    identity = RunId(workload(candidate.precision or None), v.method, v.mode, workers, tasks=tuple(v.tasks or ()),
                     settings=v.settings)
    run = plan_run(identity, None, "runs", list(trainer_args), os.cpu_count() or 1)
    return "\n".join([f"# {candidate.label}: its best found by hvdps tune",
                      "# the comparison's run of it:",
                      shlex.join(["hvdps", "compare", "--workers", str(workers), "--backends", candidate.entry,
                                  *trainer_args, "--out", f"runs/best-{v.method}"]),
                      "# its launcher's own line (from the repository, with its virtualenv):",
                      shlex.join(run.cmd), ""])


def manifest_of(candidate, workers, trainer_args, image, into):
    """hvdps k8s's manifest of the candidate's run (the command itself, run as a child, bounded),
    written into ``into``: (its file name, None), or (None, the one line why not)."""
    with tempfile.TemporaryDirectory(dir=into) as tmp:
        argv = [sys.executable, "-m", "hvdps.cli", "k8s", "--backends", candidate.entry, "--workers", str(workers),
                "--image", image, *trainer_args, "--out", tmp]
        try:
            done = subprocess.run(argv, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=K8S_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return None, f"hvdps k8s did not finish in {K8S_TIMEOUT_S} s"
        docs = sorted(f for f in os.listdir(tmp) if f.endswith(".yaml") and f != "results-pvc.yaml")
        if done.returncode != 0 or not docs:
            return None, (done.stderr.strip().splitlines() or ["hvdps k8s wrote nothing"])[-1]
        name = f"{candidate.method}.yaml"
        shutil.move(os.path.join(tmp, docs[0]), os.path.join(into, name))
        if os.path.exists(os.path.join(tmp, "results-pvc.yaml")):
            shutil.move(os.path.join(tmp, "results-pvc.yaml"), os.path.join(into, "results-pvc.yaml"))
        return name, None


def write_best(tuned, out, args, trainer_args, workers):
    """best/<method>.sh, .sbatch and .yaml for each method's best, and best/winner.* for the first of
    the verdict best against best."""
    into = os.path.join(out, "best")
    make_dirs(into)
    workload = lambda precision=None: workload_name(args.model, precision or args.precision, args.jit_compile)
    notes = []
    for m in tuned.methods:
        if not m.best:
            continue
        c = m.best[0]
        flags = list(trainer_args) + c.argv                   # its precision, where that is its best
        write_atomic(os.path.join(into, f"{c.method}.sh"), commands_of(c, workers, flags, workload))
        write_atomic(os.path.join(into, f"{c.method}.sbatch"), sbatch_of(c.entry, workers, flags))
        name, why = manifest_of(c, workers, flags, args.image, into)
        if why:
            notes.append(f"{c.method}: no manifest ({why})")
    if tuned.best:
        winner = tuned.best[0][0]
        for ext in ("sh", "sbatch", "yaml"):
            src = os.path.join(into, f"{winner}.{ext}")
            if os.path.exists(src):
                shutil.copyfile(src, os.path.join(into, f"winner.{ext}"))
    if notes:
        write_atomic(os.path.join(into, "README.txt"), "\n".join(notes) + "\n")
    return into
