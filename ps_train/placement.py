"""Where a PS job's tasks go on the hosts it is given (``--hosts`` with ``--ps_placement``): the
parameter servers on hosts of their own or beside the workers, the workers by slot, TF2's
coordinator beside the first worker. Read by ps_train/launch.py, which starts the tasks there, and by
the comparison, which reports each run's roles (PSLauncher.roles, ps_train/method.py)."""
from common.base.errors import UsageError
from common.launch.remote import take_slots

PLACEMENTS = ("own", "beside")


def place_ps(hosts, num_workers, num_ps, placement="own", chief=False):
    """Roles on hosts: {"ps": [host...], "worker": [host...], "chief": [host]}.

    ``own``: each PS on a host of its own (the first ``num_ps`` hosts), so its link is the PS's
    alone; the workers fill the slots of the remaining hosts. ``beside``: the workers fill slots
    from the first host and the PS tasks go on the workers' hosts in turn. A separate chief
    (TF2's coordinator) goes beside the first worker."""
    if placement not in PLACEMENTS:
        raise UsageError(f"--ps_placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
    if placement == "own":
        if len(hosts) <= num_ps:
            names = ", ".join(h for h, _ in hosts[:num_ps])
            raise UsageError(f"--ps_placement own: PS host(s) {names} would also be the only worker host(s); "
                             f"list more hosts or use --ps_placement beside")
        ps = [h for h, _ in hosts[:num_ps]]
        workers = [h for h, s in take_slots(hosts[num_ps:], num_workers, where="beside the PS host(s)")
                   for _ in range(s)]
    else:
        workers = [h for h, s in take_slots(hosts, num_workers) for _ in range(s)]
        used = list(dict.fromkeys(workers))
        ps = [used[i % len(used)] for i in range(num_ps)]
    roles = {"ps": ps, "worker": workers}
    if chief:
        roles["chief"] = [workers[0]]
    return roles
