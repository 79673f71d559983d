import pytest
from hypothesis import given
from hypothesis import strategies as st

from nvmeof_csi.csi import params
from nvmeof_csi.errors import InvalidArgument
from nvmeof_csi.nvmeof.context import TUNABLE_KEYS
from nvmeof_csi.nvmeof.dataset import KEYS as DATASET_KEYS
from nvmeof_csi.nvmeof.parameters import KNOWN, PARAMETERS, VolumeParameters, parameters_table
from nvmeof_csi.nvmeof.qos import QOS_KEY_NAMES


def test_defaults_and_sidecar_keys() -> None:
    opts = params.parse({"csi.storage.k8s.io/pvc/name": "x", "csi.storage.k8s.io/pv/name": "pv-1"})
    assert opts.transport == "tcp"
    assert params.parse({"csi.storage.k8s.io/pvc/name": "x", "queueSize": "64"}).to_map()["queueSize"] == "64"
    assert "csi.storage.k8s.io/pvc/name" not in params.parse({"csi.storage.k8s.io/pvc/name": "x"}).to_map()


def test_typed_values() -> None:
    opts = params.parse({"transport": "rdma", "ctrlLossTmo": "600", "queueSize": "128"})
    assert opts.transport == "rdma"
    assert opts.tunable("ctrlLossTmo") == 600
    assert opts.tunable("queueSize") == 128
    assert opts.tunable("tos") is None


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
        ({"replicas": "3"}, "'replicas' must be 1 or 2"),
        ({"replicas": "2", "dataset.uri": "/datasets/x"}, "does not combine with a dataset"),
        ({"replicas": "2", "auth": "dhchap"}, "auth or tls yet"),
        ({"replicas": "2", "tls": "psk"}, "auth or tls yet"),
    ],
)
def test_rejects_name_the_key(given: dict[str, str], needle: str) -> None:
    with pytest.raises(InvalidArgument, match=needle):
        params.parse(given)


def test_the_configuration_table_is_made_from_the_one_declaration() -> None:
    from tests.support.env import ROOT

    table = parameters_table()
    doc = (ROOT / "docs" / "configuration.md").read_text()
    assert table in doc, f"docs/configuration.md's StorageClass table differs; it should read:\n{table}"
    assert len(PARAMETERS) == 20 and set(QOS_KEY_NAMES) | set(TUNABLE_KEYS) | set(DATASET_KEYS) <= KNOWN
    assert "replicas" in KNOWN


def test_replicas_default_to_one_and_only_two_travels_in_the_map() -> None:
    one, two = VolumeParameters.parse({}), VolumeParameters.parse({"replicas": "2"})
    assert (one.replicas, two.replicas) == (1, 2) and VolumeParameters.parse({"replicas": "1"}) == one
    assert "replicas" not in one.to_map() and two.to_map()["replicas"] == "2"
    assert VolumeParameters.parse(two.to_map()) == two and two.immutable().replicas == 2


_VALUES = {
    "transport": st.sampled_from(["tcp", "rdma"]),
    "auth": st.sampled_from(["none", "dhchap", "dhchap-bidirectional"]),
    "ctrlLossTmo": st.integers(1, 3600).map(str),
    "queueSize": st.integers(16, 1024).map(str),
    "readIops": st.sampled_from(["0", "max", "1", "500", "100000000"]),
    "writeBps": st.integers(0, 1 << 44).map(str),
    "dataset.uri": st.sampled_from(["/srv/ds", "s3://bucket/x"]),
    "dataset.pin": st.sampled_from(["true", "false", "TRUE"]),
    "dataset.ttl": st.integers(0, 86400).map(str),
}


@given(st.fixed_dictionaries({}, optional=_VALUES))
def test_to_map_is_the_inverse_of_parse(raw: dict[str, str]) -> None:
    if any(k.startswith("dataset.") for k in raw):
        raw.setdefault("dataset.uri", "/srv/ds")  # a data set needs a uri or a path
    parsed = VolumeParameters.parse(raw)
    assert VolumeParameters.parse(parsed.to_map()) == parsed
    assert VolumeParameters.parse({**raw, "csi.storage.k8s.io/pvc/name": "x"}) == parsed


def test_changes_lift_and_set_limits_and_leave_the_rest() -> None:
    base = VolumeParameters.parse({"readIops": "500", "writeIops": "100", "queueSize": "64"})
    changed = base.with_changes({"readIops": "max", "writeBps": "1048576"})
    assert changed.limits.values == (("writeIops", 100), ("writeBps", 1048576))
    assert changed.immutable() == base.immutable() and changed != base
    assert VolumeParameters.parse({"tls": "psk"}).tls == "psk"
    with pytest.raises(InvalidArgument, match="transport tcp only"):
        VolumeParameters.parse({"tls": "psk", "transport": "rdma"})


def test_the_charts_schema_holds_the_parameters_this_declaration_makes() -> None:
    """One declaration: the chart refuses a mistyped key or an unknown mode at ``helm install``
    (``deploy/helm/bad-values/class-parameter-*.yaml``); before, any key passed and failed later as a PVC event."""
    import json

    from nvmeof_csi.nvmeof.parameters import parameters_schema
    from tests.support.env import ROOT

    schema = json.loads((ROOT / "deploy" / "helm" / "nvmeof-csi" / "values.schema.json").read_text())
    wanted = {"storageClasses": parameters_schema(), "volumeAttributesClasses": parameters_schema(mutable=True)}
    for key, expected in wanted.items():
        found = schema["properties"][key]["items"]["properties"]["parameters"]
        assert found == expected, (
            f"values.schema.json {key}[].parameters should read:\n{json.dumps(expected, indent=2)}"
        )
