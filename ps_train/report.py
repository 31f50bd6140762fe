"""What the report says of the parameter-server runs alone (declared in ps_train/method.py, written
by hvdps/render/report.py): how each run's PS tasks split the model, each worker's wait, what CPU
the PS tasks spent and the gradients they dropped."""
from common.trainer.backend import MIN_SHARD_BYTES
from hvdps.render.styles import name_of


def shards_section(rows):
    """Markdown: how each run with several PS tasks splits the model's bytes over them (header
    ``ps_shard_bytes``, ``placement``): what each PS link carries per worker batch, each way."""
    lines = []
    for r in rows:
        header = r.header
        shares = (header.ps_shard_bytes if header else None) or {}
        total = sum(shares.values())
        if len(shares) < 2 or not total:
            continue
        split = sorted(name for name, devices in (header.placement or {}).items() if len(devices) > 1)
        lines.append(f"| {r.model or '-'} {name_of(r)}, {r.workers} workers | " +
                     ", ".join(f"{task} {b:,} ({100 * b / total:.0f}%)" for task, b in sorted(shares.items())) +
                     f" | {max(shares.values()) * len(shares) / total:.2f} | {', '.join(split) or '-'} |")
    if not lines:
        return []
    return ["## Model bytes per PS task", "",
            "The trainable variables' bytes each PS task holds, so what its link carries per worker batch each "
            f"way (header `ps_shard_bytes`). Both PS trainers split a variable larger than {MIN_SHARD_BYTES:,} "
            "bytes along its first axis, at most one shard per task, and place shards and whole variables "
            "round robin; *busiest / even* is the largest task's bytes over M/k.", "",
            "| run | bytes per PS task | busiest / even | split variables |", "|---|---|---|---|"] + lines + [""]


def ps_details(r):
    """The run's explanation, continued (PSMethod.measures): in sync mode each worker's wait for its
    token (the one that waits least is the one the others wait for); the bytes a PS task carries per
    update; the CPU its PS tasks spent; and in sync mode the gradients pushed and never applied (with
    backup workers, the late ones: lost work)."""
    m = r.measured
    if m is None:
        return ""
    text = ""
    waits = m.wait_per_worker_s
    if waits and len(waits) > 1:
        name = lambda i: f"rank {i}" + (" (the chief)" if i == 0 else "")
        each = ", ".join(f"{name(i)} {1e3 * w:.2f} ms" for i, w in enumerate(waits))
        least = min(range(len(waits)), key=waits.__getitem__)
        text += f"; wait per step: {each}; the one that waits least, {name(least)}, is the slowest"
    if m.bytes_per_update_per_ps is not None:
        text += f"; {m.bytes_per_update_per_ps:,} bytes per update through each PS task"
    if m.ps_cpu_share is not None:
        text += (f"; the PS task(s) used {m.ps_cpu_s:.1f} CPU s in the measured interval, "
                 f"{100 * m.ps_cpu_share:.0f}% of a core each")
    if m.dropped_gradients:
        text += f"; {m.dropped_gradients:,} gradient(s) pushed and dropped as stale (computed, never applied)"
    return text
