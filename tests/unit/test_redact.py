from nvmeof_csi.gen import csi_pb2, nvmeof_agent_pb2
from nvmeof_csi.rpc.redact import REDACTED, safe_text


def test_secrets_are_stripped_and_message_untouched() -> None:
    req = csi_pb2.NodeStageVolumeRequest(
        volume_id="v1", staging_target_path="/s", secrets={"dhchap": "DHHC-1:00:topsecret:"}
    )
    text = safe_text(req)
    assert "topsecret" not in text
    assert "dhchap" not in text
    assert REDACTED in text and "v1" in text
    assert req.secrets["dhchap"] == "DHHC-1:00:topsecret:"  # the original keeps its value


def test_every_secret_field_of_the_spec_is_caught() -> None:
    """Any field the spec marks csi_secret, in any request, never reaches the text."""
    checked = 0
    for name in dir(csi_pb2):
        cls = getattr(csi_pb2, name)
        if not (isinstance(cls, type) and name.endswith("Request") and hasattr(cls, "DESCRIPTOR")):
            continue
        msg = cls()
        if "secrets" in cls.DESCRIPTOR.fields_by_name:
            msg.secrets["k"] = "s3cr3t-value"
            assert "s3cr3t-value" not in safe_text(msg), name
            checked += 1
    assert checked >= 10


def test_nested_messages_are_kept() -> None:
    req = csi_pb2.CreateVolumeRequest(name="pvc-1", capacity_range=csi_pb2.CapacityRange(required_bytes=5))
    text = safe_text(req)
    assert "pvc-1" in text and "required_bytes: 5" in text


def test_host_keys_never_reach_a_log_line() -> None:
    """Before, ``tls_psk`` was not stripped: at DEBUG every GetHostKeys reply logged the host's TLS PSK."""
    keys = nvmeof_agent_pb2.HostKeys(
        dhchap_secret="DHHC-1:00:hostkey:", dhchap_ctrl_secret="DHHC-1:00:ctrlkey:", tls_psk="NVMeTLSkey-1:01:pskbytes:"
    )
    text = safe_text(keys)
    assert "hostkey" not in text and "ctrlkey" not in text and "pskbytes" not in text and REDACTED in text


def test_every_key_field_of_the_agent_api_is_caught() -> None:
    """Any string field of the agent API whose name says it holds a key is stripped, in every message."""
    checked = 0
    for message in nvmeof_agent_pb2.DESCRIPTOR.message_types_by_name.values():
        for field in message.fields:
            if field.type != field.TYPE_STRING or not any(w in field.name for w in ("secret", "psk")):
                continue
            msg = getattr(nvmeof_agent_pb2, message.name)(**{field.name: "k3y-material"})
            assert "k3y-material" not in safe_text(msg), f"{message.name}.{field.name}"
            checked += 1
    assert checked >= 5


def test_a_replicas_drbd_secret_never_reaches_a_log_line() -> None:
    secret = "00112233445566778899aabbccddeeff"
    req = nvmeof_agent_pb2.CreateVolumeRequest(name="pvc-r", replica={"secret": secret, "port": "7800"})
    text = safe_text(req)
    assert secret not in text and REDACTED in text and "7800" in text
    assert req.replica["secret"] == secret  # the original keeps its value
