"""``--dataset pysrc``: the source files of Python's own standard library as byte-level text.

Real text that no one here wrote, about 30 MB in about 1,800 files, present wherever Python is: what a
language model can be trained and judged on with nothing downloaded. Every ``.py`` file under the
interpreter's standard library (``sysconfig``'s ``stdlib``; ``site-packages`` and ``dist-packages``, the
installed packages, left out), read as bytes.

The held-out split is made by file, never by position in a file: the files are ordered by the SHA-256
of their path inside the library, and the first of that order are held out until they hold
``HELDOUT_FRACTION`` of the bytes. A held-out file is one the model never saw a line of, and the same
library gives the same split on every machine.

Each split's files are joined in path order and cut into sequences of ``seq_len + 1`` bytes, one after
another: the model reads the first ``seq_len`` bytes of each and is scored on each next byte (x are
bytes 0..seq_len-1, y bytes 1..seq_len).
"""
import hashlib
import os
import sysconfig

import numpy as np

from common.base.errors import UsageError

HELDOUT_FRACTION = 0.01       # ~300 KB held out: an evaluation of ~4,700 sequences of 64 bytes
SKIP = ("site-packages", "dist-packages", "__pycache__")
MAX_BYTES = 256 << 20         # a library larger than this is not a standard library


def library(root=None):
    """The standard library's folder: ``root`` or this interpreter's."""
    return root or sysconfig.get_paths()["stdlib"]


def source_files(root=None):
    """[(path inside the library, absolute path)] of its .py files, sorted by the first, symbolic
    links not followed (a link out of the library would read what is not the library)."""
    root = library(root)
    if not os.path.isdir(root):
        raise UsageError(f"--dataset pysrc: the standard library {root} is not a folder")
    out = []
    for folder, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d not in SKIP)
        for name in files:
            path = os.path.join(folder, name)
            if name.endswith(".py") and os.path.isfile(path) and not os.path.islink(path):
                out.append((os.path.relpath(path, root), path))
    if not out:
        raise UsageError(f"--dataset pysrc: no .py files under {root}")
    return sorted(out)


def split_files(files):
    """(train, held out): ``files`` ([(relative path, size)]) split by file, the held-out ones the first
    in the order of their path's SHA-256 until they hold ``HELDOUT_FRACTION`` of the bytes."""
    total = sum(size for _, size in files)
    held, have = set(), 0
    for rel, size in sorted(files, key=lambda f: hashlib.sha256(f[0].encode()).hexdigest()):
        if have >= HELDOUT_FRACTION * total:
            break
        held.add(rel)
        have += size
    return [f for f in files if f[0] not in held], [f for f in files if f[0] in held]


def read_splits(root=None):
    """{"train": bytes, "test": bytes} of the library, each split's files joined in path order."""
    found = source_files(root)
    sizes = [(rel, os.path.getsize(path)) for rel, path in found]
    if sum(size for _, size in sizes) > MAX_BYTES:
        raise UsageError(f"--dataset pysrc: {library(root)} holds more than {MAX_BYTES >> 20} MiB of .py files; "
                         f"not a standard library")
    where = dict(found)
    train, test = split_files(sizes)
    out = {}
    for split, part in (("train", train), ("test", test)):
        chunks = []
        for rel, _ in part:
            with open(where[rel], "rb") as f:
                chunks.append(f.read(MAX_BYTES))
        out[split] = b"".join(chunks)
    return out


def sequences(data, seq_len):
    """(x, y) uint8 arrays of shape (n, seq_len): consecutive windows of ``seq_len + 1`` bytes of ``data``,
    each y the bytes one on from its x."""
    a = np.frombuffer(data, np.uint8)
    n = (len(a) - 1) // seq_len
    if n < 1:
        raise UsageError(f"--seq_len {seq_len}: longer than the {len(a)} bytes of a split")
    windows = a[: n * seq_len + 1]
    return windows[:-1].reshape(n, seq_len), windows[1:].reshape(n, seq_len)


def load_pysrc(cfg, root=None):
    """(x_train, y_train, x_test, y_test) of ``--seq_len`` bytes each."""
    splits = read_splits(root)
    return (*sequences(splits["train"], cfg.seq_len), *sequences(splits["test"], cfg.seq_len))
