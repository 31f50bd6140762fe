"""One readable line per failure, whatever raised it."""
import pytest

from common.errors import describe


class FakeOpError(Exception):
    def __init__(self, message):
        super().__init__(message)
        self.message = message


@pytest.mark.parametrize("exc, expected", [
    (FakeOpError("{{function_node __wrapped__SaveV2_dtypes_14_device_/job:localhost/replica:0/task:0/device:CPU:0}}"
                 " /r/checkpoints/ckpt-30_temp/part-00000.tempstate42; No space left on device [Op:SaveV2]"),
     "No space left on device"),
    (FakeOpError("Read less bytes than requested\nmore detail"), "Read less bytes than requested"),
    (OSError(28, "No space left on device"), "No space left on device"),
    (ValueError(""), "ValueError"),
    (RuntimeError("plain; two parts"), "two parts"),
    (FakeOpError("{{function_node __inference_train_step_1}} 2 root error(s) found.\n"
                 "  (0) UNAVAILABLE: /job:worker/replica:0/task:1: Socket closed\n"
                 "  (1) CANCELLED: Cancelled\n0 successful operations."),
     "UNAVAILABLE: /job:worker/replica:0/task:1: Socket closed"),
    (FakeOpError("3 root error(s) found.\nno numbered cause"), "3 root error(s) found."),
])
def test_describe(exc, expected):
    assert describe(exc) == expected
