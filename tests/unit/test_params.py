import pytest

from nvmeof_csi.csi import params
from nvmeof_csi.errors import InvalidArgument


def test_defaults_and_sidecar_keys() -> None:
    opts = params.parse({"csi.storage.k8s.io/pvc/name": "x", "csi.storage.k8s.io/pv/name": "pv-1"})
    assert opts.transport == "tcp"
    assert params.stored_parameters({"csi.storage.k8s.io/pvc/name": "x", "queueSize": "64"}) == {"queueSize": "64"}


def test_typed_values() -> None:
    opts = params.parse({"transport": "rdma", "ctrlLossTmo": "600", "queueSize": "128"})
    assert opts.transport == "rdma"
    assert opts.get("ctrlLossTmo") == 600
    assert opts.get("queueSize") == 128
    assert opts.get("tos") is None


@pytest.mark.parametrize(
    ("given", "needle"),
    [
        ({"colour": "blue"}, "'colour'"),
        ({"transport": "fc"}, "transport"),
        ({"transport": "tcp,rdma"}, "one transport per volume"),
        ({"readIops": "fast"}, "readIops"),
        ({"writeBps": "-1"}, "writeBps"),
        ({"ctrlLossTmo": "-1"}, "ctrlLossTmo"),
        ({"ctrlLossTmo": "forever"}, "integer"),
        ({"queueSize": "4096"}, "queueSize"),
        ({"tos": "256"}, "tos"),
    ],
)
def test_rejects_name_the_key(given: dict[str, str], needle: str) -> None:
    with pytest.raises(InvalidArgument, match=needle):
        params.parse(given)
