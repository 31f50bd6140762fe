"""One readable line per failure, whatever raised it."""
import pytest

from common.base.errors import RunError, UsageError, describe


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
    # TensorFlow 2.21's graph-mode message, as a session.run on a closed queue raises it
    (FakeOpError("Graph execution error:\n\nDetected at node 'fifo_queue_Dequeue' defined at (most recent call last):\n"
                 "    File \"<stdin>\", line 8, in <module>\nNode: 'fifo_queue_Dequeue'\n"
                 "FIFOQueue '_0_fifo_queue' is closed and has insufficient elements (requested 1, current size 0)\n"
                 "\t [[{{node fifo_queue_Dequeue}}]]"),
     "FIFOQueue '_0_fifo_queue' is closed and has insufficient elements (requested 1, current size 0)"),
    (FakeOpError("Graph execution error:\n\nDetected at node 'x' defined at (most recent call last):\n"
                 "    File \"t.py\", line 1, in <module>\nNode: 'x'\n2 root error(s) found.\n"
                 "  (0) CANCELLED: Step was cancelled\n  (1) ABORTED: aborted\n0 successful operations."),
     "CANCELLED: Step was cancelled"),
])
def test_describe(exc, expected):
    assert describe(exc) == expected


@pytest.mark.unit
@pytest.mark.parametrize("kind, quiet, code", [("UsageError", False, 2), ("RunError", False, 1),
                                               ("InputError", True, 1)])
def test_an_error_said_before_a_teardown_is_said_once_and_first(monkeypatch, capsys, kind, quiet, code):
    """A PS chief prints its error before releasing its tasks (a crash while releasing cannot lose
    the line), and cli does not print it again: one line, ahead of what the teardown printed."""
    import sys
    import common.base.errors as errors
    monkeypatch.setenv("HVDPS_QUIET_ERRORS", "1" if quiet else "0")

    @errors.cli
    def main():
        try:
            raise getattr(errors, kind)("chief: reading the training data: f: record 2")
        except Exception as exc:
            errors.say_first(exc)
            print("releasing the tasks", file=sys.stderr, flush=True)
            raise

    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == code
    assert capsys.readouterr().err.splitlines() == ["error: chief: reading the training data: f: record 2",
                                                    "releasing the tasks"]


@pytest.mark.unit
@pytest.mark.parametrize("kind, message, line", [
    (UsageError, "unknown model '0\n' (valid: mlp)", "unknown model '0\\n' (valid: mlp)"),   # a config's value
    (UsageError, "no 'x' feature (present: a\tb\x1b)", "no 'x' feature (present: a\\tb\\x1b)"),
    (UsageError, "--namespace straße: not a label", "--namespace straße: not a label"),       # printable: as given
    (RunError, "rank 1: lost\r\nrank 2", "rank 1: lost\\r\\nrank 2"),
])
def test_an_error_quoting_a_value_is_one_line_whatever_the_value_holds(kind, message, line):
    assert str(kind(message)) == line
