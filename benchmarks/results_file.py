"""One way for every benchmark to write its raw results: the exact command beside the figures."""
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def save(path, args, **payload):
    """Write ``payload`` to ``path`` with the command line that produced it, the time and the cores."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"command": " ".join([os.path.relpath(os.path.abspath(sys.argv[0]), REPO), *sys.argv[1:]]),
                   "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpus": os.cpu_count(),
                   "settings": vars(args), **payload}, f, indent=2)
