"""Protobuf messages made safe to log: every ``secrets`` map, every field whose name ends in ``secret`` or
``psk`` (our agent API: DH-HMAC-CHAP keys, NVMe/TCP TLS pre-shared keys), every map entry whose key ends so (a
replicated volume's DRBD ``secret`` in CreateVolume's ``replica`` map) and every field the CSI spec marks
``csi_secret`` is replaced by a placeholder, at any depth. The input message is never modified.
"""

from __future__ import annotations

from functools import cache

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.text_format import MessageToString

from nvmeof_csi.gen import csi_pb2

REDACTED = "***stripped***"
SECRET_OPTION = csi_pb2.DESCRIPTOR.package + ".csi_secret"
SECRET_SUFFIXES = ("secret", "psk")  # a field of ours named so holds key material


@cache  # a pure function of an immutable descriptor (a fixed, small set): computed once per field
def _is_secret(field: FieldDescriptor) -> bool:
    if field.name == "secrets" or field.name.endswith(SECRET_SUFFIXES):
        return True
    return any(opt.full_name == SECRET_OPTION and bool(value) for opt, value in field.GetOptions().ListFields())


def _scrub(msg: Message) -> list[str]:
    stripped: list[str] = []
    for field, value in msg.ListFields():
        if _is_secret(field):
            msg.ClearField(field.name)
            stripped.append(field.name)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                # a map: an entry whose key names key material (a replica's DRBD ``secret``) is blanked
                for key in [k for k in value if isinstance(k, str) and k.lower().endswith(SECRET_SUFFIXES)]:
                    if isinstance(value[key], str):
                        value[key] = REDACTED
                        stripped.append(f"{field.name}.{key}")
                continue
            if field.is_repeated:
                for item in value:
                    stripped += _scrub(item)
            else:
                stripped += _scrub(value)
    return stripped


def safe_text(msg: Message) -> str:
    """One-line text form of ``msg`` with secrets stripped."""
    copy = type(msg)()
    copy.CopyFrom(msg)
    stripped = _scrub(copy)
    text = MessageToString(copy, as_one_line=True)
    if stripped:
        text += f" {','.join(sorted(set(stripped)))}: {REDACTED}"
    return text
