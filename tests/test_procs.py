"""common/base/procs.py: what the machine says about itself."""
import pytest

from common.base.procs import available_memory

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("text, expected", [
    ("MemTotal:       24576000 kB\nMemFree:  100 kB\nMemAvailable:   23000000 kB\n", 23000000 * 1024),
    ("MemAvailable: 4096\n", 4096),                          # no unit: bytes
    ("MemTotal:       24576000 kB\nMemFree:  100 kB\n", None),     # a kernel older than 3.14
    ("MemAvailable: lots kB\n", None),
    ("", None),
])
def test_available_memory_reads_memavailable(tmp_path, text, expected):
    path = tmp_path / "meminfo"
    path.write_text(text)
    assert available_memory(str(path)) == expected


def test_available_memory_without_the_file(tmp_path):
    assert available_memory(str(tmp_path / "absent")) is None


def test_available_memory_of_this_machine():
    with open("/proc/meminfo") as f:
        total = int(next(line for line in f if line.startswith("MemTotal:")).split()[1]) * 1024
    assert 0 < available_memory() <= total
