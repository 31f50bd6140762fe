"""hvdps: one command, a subcommand for each thing a user does.

    hvdps compare --workers 1,2 --backends horovod,ps --out runs/cmp    # train side by side, one report
    hvdps tune --workers 2 --backends horovod,mpi --budget 900          # each method at its best, then compared
    hvdps project --from runs/cmp/runs --bandwidth_gbps 25 ...          # those runs on another network
    hvdps emulate --hosts 4 --rate 50mbit --out runs/emu -- ...         # the comparison on shaped hosts (root)
    hvdps hosts hostfiles/hostfile.example                              # one inventory to every format
    hvdps data --dataset digits --shards 8 --out data/digits            # a data set as TFRecord shards
    hvdps k8s --backends ps,mwms,horovod --image IMG:TAG --out k8s/     # the runs as Kubernetes manifests
    hvdps train METHOD [trainer flags]                                  # one trainer process
    hvdps launch METHOD [flags]                                         # a whole job here (or --hosts)

METHOD is any name ``--backends`` takes (hvdps/methods.py, the registry): the trainer is the one its
package declares (``<package>/main.py``, told what the method adds, such as ``--ps_api v2``), the job
the one its launcher starts (a package's own launch module, or the mpirun line hvdps compare uses), so
a method added as a package is a subcommand with no edit here. Each subcommand is the module's own
``main``: the same flags, checks and exit codes as ``python horovod_train/main.py`` or
``python -m ps_train.launch``, which keep working, as do ``horovodrun -np 4 python
horovod_train/main.py`` and ``mpirun ... python mpi_train/main.py``.
Every flag takes its underscore spelling (``--dry_run``, ``--run_timeout``) and the hyphenated one alike.
"""
import importlib
import sys

from common.base.errors import UsageError, cli
from hvdps.methods import METHODS


# subcommand: (module whose main() it runs, what it does)
TOOLS = {
    "compare": ("hvdps.commands.compare", "train one model several ways and report them side by side"),
    "tune": ("hvdps.commands.tune", "search each method's own settings and compare the methods best against best"),
    "project": ("hvdps.commands.project", "project measured or described runs to other networks and worker counts"),
    "emulate": ("hvdps.commands.emulate", "run a comparison on an emulated cluster of shaped hosts (root)"),
    "hosts": ("hvdps.commands.hosts", "write one host inventory in every launcher's format"),
    "data": ("hvdps.commands.data", "write a data set as TFRecord shards, streamed by --dataset tfrecord"),
    "k8s": ("hvdps.commands.k8s", "write a comparison's runs as Kubernetes JobSets and MPIJobs, checked"),
}
GROUPS = {"train": "one trainer process of a method (under horovodrun, mpirun, srun or alone)",
          "launch": "a whole job of a method's tasks (here; PS and MWMS also --hosts)"}


def entry(group, method):
    """(module, the argv it is given before the user's) of ``hvdps GROUP METHOD``."""
    launcher = method.launcher
    if group == "train":
        return f"{method.package}.main", list(launcher.trainer_flags)
    return launcher().launch_entry(method.name)


def usage(group=None):
    if group:
        return "\n".join([f"usage: hvdps {group} METHOD [flags]   (hvdps {group} METHOD --help for its flags)",
                          "", f"{GROUPS[group]}; METHOD is one of: {', '.join(METHODS)}"])
    rows = [(name, what) for name, (_, what) in TOOLS.items()]
    rows += [(f"{group} {'|'.join(METHODS)}", what) for group, what in GROUPS.items()]
    width = max(len(name) for name, _ in rows) + 2
    return "\n".join(["usage: hvdps SUBCOMMAND [flags]   (hvdps SUBCOMMAND --help for its flags)", "", "subcommands:",
                      *(f"  {name:<{width}}{what}" for name, what in rows)])


def resolve(argv):
    """(module, the subcommand's own argv, its program name) for ``hvdps ARGV``; UsageError otherwise."""
    if not argv:
        raise UsageError("a subcommand is needed (valid: " + ", ".join([*TOOLS, *GROUPS]) + "); hvdps --help lists them")
    name, rest = argv[0], argv[1:]
    if name in TOOLS:
        return TOOLS[name][0], rest, f"hvdps {name}"
    if name in GROUPS:
        if not rest or rest[0] not in METHODS:
            got = f"'{rest[0]}'" if rest else "none"
            raise UsageError(f"hvdps {name}: unknown method {got} (valid: {', '.join(sorted(METHODS))})")
        module, first = entry(name, METHODS[rest[0]])
        return module, [*first, *rest[1:]], f"hvdps {name} {rest[0]}"
    raise UsageError(f"unknown subcommand '{name}' (valid: {', '.join([*TOOLS, *GROUPS])})")


@cli
def _dispatch(argv):
    if argv[:1] in (["-h"], ["--help"]):
        print(usage())
        return 0
    if argv[:1] in (["train"], ["launch"]) and argv[1:2] in (["-h"], ["--help"]):
        print(usage(argv[0]))
        return 0
    module, rest, prog = resolve(argv)
    sys.argv = [prog, *rest]          # main() reads its own flags, as when it is the process (a PS task
    return importlib.import_module(module).main()   # re-executes itself with sys.orig_argv: hvdps again)


def main(argv=None):
    return _dispatch(sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
    sys.exit(main())
