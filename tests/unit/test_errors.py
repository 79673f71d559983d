import grpc
import pytest

from nvmeof_csi import errors
from nvmeof_csi.rpc.boundary import is_expected, to_status

CASES = [
    (errors.InvalidArgument("x"), grpc.StatusCode.INVALID_ARGUMENT),
    (errors.NotFound("x"), grpc.StatusCode.NOT_FOUND),
    (errors.AlreadyExists("x"), grpc.StatusCode.ALREADY_EXISTS),
    (errors.FailedPrecondition("x"), grpc.StatusCode.FAILED_PRECONDITION),
    (errors.OutOfRange("x"), grpc.StatusCode.OUT_OF_RANGE),
    (errors.ResourceExhausted("x"), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.Aborted("x"), grpc.StatusCode.ABORTED),
    (errors.Unavailable("x"), grpc.StatusCode.UNAVAILABLE),
    (errors.DeadlineExceeded("x"), grpc.StatusCode.DEADLINE_EXCEEDED),
    (errors.Unimplemented("x"), grpc.StatusCode.UNIMPLEMENTED),
    (errors.CommandError(["mount", "a"], 32, "", "busy"), grpc.StatusCode.INTERNAL),
    (KeyError("bug"), grpc.StatusCode.INTERNAL),
    (ZeroDivisionError(), grpc.StatusCode.INTERNAL),
]


@pytest.mark.parametrize(("exc", "code"), CASES)
def test_mapping_by_class(exc: Exception, code: grpc.StatusCode) -> None:
    got, message = to_status(exc)
    assert got == code
    assert message
    assert is_expected(exc) == isinstance(exc, errors.DriverError)


def test_subclass_inherits_code() -> None:
    class VolumeGone(errors.NotFound):
        pass

    assert to_status(VolumeGone("v"))[0] == grpc.StatusCode.NOT_FOUND


def test_command_error_message_names_command_and_stderr() -> None:
    err = errors.CommandError(["mkfs.ext4", "/dev/x"], 1, "", "line1\ndevice busy\n")
    assert "mkfs.ext4 /dev/x exited 1: device busy" in str(err)
