"""Every file hvdps writes or reads as input goes through here.

Writes never go through a planted link and never leave half a file: a new file is
created exclusively (``O_EXCL`` fails on any existing name, a symbolic link included)
under a random temporary name in the target's folder, written, given its mode, then
renamed over the final name. ``rename`` replaces a link at the final name rather than
writing through it. Appends (``metrics.jsonl``) open with ``O_NOFOLLOW``. Modes are set
explicitly: 0644 files and 0755 folders, or stricter when the umask asks for it (a
umask of 000 must not leave world-writable results on a shared cluster file system).
A full disk or any other ``OSError`` is one line naming the path.

Reads of input files (IDX, npz, hostfiles, cluster specs, metrics) refuse what is not a
regular file (a FIFO or a device would block or never end) and anything above a size
bound, before reading a byte.
"""
import contextlib
import fcntl
import os
import shutil
import stat
import tempfile

from common.base.errors import RunError, UsageError

FILE_MODE = 0o644
DIR_MODE = 0o755
MiB = 2 ** 20


class WriteError(RunError):
    """A result could not be written (full disk, read-only, a link in the way)."""


def umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def file_mode():
    return FILE_MODE & ~umask()


def refuse_link(path, what="output"):
    """The named output must not be a symbolic link: hvdps never writes through one."""
    if os.path.islink(path):
        raise UsageError(f"{path} is a symbolic link (to {os.readlink(path)}); refusing to write "
                         f"{what} through it: remove it or choose another directory")


def make_dirs(path):
    """``os.makedirs`` whose new folders get 0755 (or a stricter umask), whatever a loose umask says."""
    path = os.path.abspath(path)
    missing = []
    p = path
    while not os.path.lexists(p):
        missing.append(p)
        p = os.path.dirname(p)
    try:
        os.makedirs(path, exist_ok=True)
        for d in missing:
            os.chmod(d, DIR_MODE & ~umask())
    except OSError as exc:
        raise WriteError(f"cannot create {path}: {exc.strerror}")
    return path


def writable_dir(path, flag):
    """Create ``path`` (0755) and prove it writable by writing there: root passes ``os.access``
    everywhere, so only trying tells (/proc, read-only mounts). A UsageError naming ``flag``."""
    try:
        make_dirs(path)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".hvdps-write-test-")
        os.close(fd)
        os.remove(probe)
    except (OSError, WriteError) as exc:
        raise UsageError(f"{flag} {path} is not writable: {getattr(exc, 'strerror', None) or exc}")


_HELD = {}        # folder -> the open descriptor whose lock this process holds, for the process's life


def take_folder(path, flag):
    """Hold an exclusive lock on the folder ``path`` until this process exits (flock on the folder
    itself: no file is added; the kernel drops it when the process ends, however it ends). A second
    writer (another hvdps compare with the same --out, another run's chief in the same --train_dir)
    is refused in one line before it writes anything, and the first loses nothing. Idempotent
    within a process (an elastic job's new rank 0 takes it again)."""
    path = os.path.realpath(path)
    if path in _HELD:
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise UsageError(f"{flag} {path}: {exc.strerror}")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise UsageError(f"{flag} {path} is in use: another hvdps run is writing there; wait for it to end "
                         f"or choose another directory")
    except OSError:              # a file system without locks (some network mounts): nothing to hold
        os.close(fd)
        return
    _HELD[path] = fd


STAGING = ".hvdps-staging-"       # a folder being written beside its final name: .<name>.hvdps-staging-<pid>


@contextlib.contextmanager
def staged_folder(path, flag, what):
    """A folder written whole or not at all, as a database writes a table: ``path`` is created empty
    (or found empty) and locked as a run folder is (``take_folder``), then the caller writes into a
    staging folder beside it (yielded), which is renamed over the empty ``path`` only when the
    block ends without an exception. A second writer is refused by the lock before it writes;
    a folder holding anything is refused (its files are the user's: never touched); a writer that is
    killed leaves ``path`` empty and its staging folder, which the next writer of ``path`` removes
    once no process holds it. ``what``: the kind of thing written, for the refusals."""
    path = os.path.abspath(path)
    if os.path.lexists(path) and not os.path.isdir(path) or os.path.islink(path):
        raise UsageError(f"{flag} {path} is a file or a link, not a folder: choose a new or empty folder for {what}")
    if os.path.ismount(path):
        raise UsageError(f"{flag} {path} is a mount point, which cannot be renamed into place: choose a folder "
                         f"inside it for {what}")
    created = not os.path.lexists(path)
    writable_dir(path, flag)
    take_folder(path, flag)
    held = _listing(path, flag)
    if held:
        shown = ", ".join(sorted(held)[:3]) + (", ..." if len(held) > 3 else "")
        raise UsageError(f"{flag} {path} already holds {len(held)} file(s) ({shown}); {what} is written only "
                         f"into a new or empty folder, so nothing there is replaced")
    parent, base = os.path.split(path)
    for name in _listing(parent, flag):                 # a killed writer's staging folder, no longer held
        if name.startswith(f".{base}{STAGING}"):
            stale = os.path.join(parent, name)
            try:
                fd = os.open(stale, os.O_RDONLY | os.O_DIRECTORY)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                shutil.rmtree(stale, ignore_errors=True)
            except OSError:
                pass
            finally:
                os.close(fd)
    stage = os.path.join(parent, f".{base}{STAGING}{os.getpid()}")
    shutil.rmtree(stage, ignore_errors=True)
    make_dirs(stage)
    take_folder(stage, flag)
    try:
        yield stage
        try:
            os.rename(stage, path)      # over the empty folder: the whole set appears at once
        except OSError as exc:
            raise WriteError(f"cannot move {what} into {path}: {exc.strerror}")
        stage = None
    finally:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
            if created:
                try:
                    os.rmdir(path)
                except OSError:
                    pass


def _listing(path, flag):
    try:
        return [n for n in os.listdir(path) if not n.startswith(".hvdps-write-test-")]
    except OSError as exc:
        raise UsageError(f"{flag} {path}: {exc.strerror}")


def write_atomic(path, content):
    """Write ``content`` (str, bytes, or a function given the open binary file) to ``path``:
    whole or not at all, never through a link, mode 0644 & ~umask. Returns ``path``."""
    folder = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            if callable(content):
                content(f)
            else:
                f.write(content.encode() if isinstance(content, str) else content)
            f.flush()
            os.fchmod(f.fileno(), file_mode())
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise WriteError(f"cannot write {path}: {exc.strerror or exc}")
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return path


def _open_flags(flags, path, what):
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
        os.fchmod(fd, file_mode())
        return fd
    except FileExistsError:
        pass
    except OSError as exc:
        raise WriteError(f"cannot write {path}: {exc.strerror}")
    refuse_link(path, what)
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise WriteError(f"cannot write {path}: {exc.strerror}")


def open_append(path, what="records"):
    """A text file to append to (created 0644 & ~umask); a link at ``path`` is refused."""
    return os.fdopen(_open_flags(os.O_WRONLY | os.O_APPEND, path, what), "a")


def open_new(path, what="a log"):
    """A fresh file to write from the start (a log handed to a child process): an earlier
    file or link at ``path`` is removed first, so the link's target is never touched."""
    if os.path.islink(path):
        try:
            os.unlink(path)
        except OSError as exc:
            raise WriteError(f"cannot replace {path}: {exc.strerror}")
    return os.fdopen(_open_flags(os.O_WRONLY | os.O_TRUNC, path, what), "w")


def read_input(path, what="file", max_bytes=2048 * MiB, binary=True):
    """The bytes (or text) of an input file: refused with one line if it is not a regular file or
    is larger than ``max_bytes``; opened non-blocking, so a FIFO cannot hang the caller."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError(f"{path}: cannot read {what}: {exc.strerror}")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode) else \
                "a device or socket"
            raise UsageError(f"{path}: {what} is {kind}, not a regular file")
        if st.st_size > max_bytes:
            raise UsageError(f"{path}: {what} is {st.st_size / MiB:.0f} MiB, more than the "
                             f"{max_bytes / MiB:.0f} MiB hvdps reads")
        with os.fdopen(fd, "rb") as f:
            fd = None
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise UsageError(f"{path}: cannot read {what}: {exc.strerror}")
    finally:
        if fd is not None:
            os.close(fd)
    if len(data) > max_bytes:
        raise UsageError(f"{path}: {what} grew past the {max_bytes / MiB:.0f} MiB hvdps reads")
    return data if binary else data.decode("utf-8", errors="replace")


def check_regular(path, what="file", max_bytes=2048 * MiB):
    """For inputs a library opens itself (np.load, gzip): the same refusal, without reading."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise UsageError(f"{path}: cannot read {what}: {exc.strerror}")
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{path}: {what} is not a regular file")
    if st.st_size > max_bytes:
        raise UsageError(f"{path}: {what} is {st.st_size / MiB:.0f} MiB, more than the "
                         f"{max_bytes / MiB:.0f} MiB hvdps reads")
