"""Hypothesis strategies that build any protobuf request from its descriptor, with hostile values: path tricks
(``..``, absolute paths into a watched folder, symlinks, NUL, 4 KiB strings, unicode), IDs that look almost
right, out-of-range numbers, and secrets carrying a marker that must never show up in a log."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, TypeVar

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

SECRET_MARKER = "S3CR3T-do-not-log"
_UUID = str(uuid.UUID(int=0x3F6C1F8E00004000800000000000001))


def hostile_strings(watched: Path) -> st.SearchStrategy[str]:
    """Text an attacker or a careless client sends where a name, an ID or a path is expected."""
    tricks = [
        "",
        ".",
        "..",
        "../../..",
        "/",
        "/etc/passwd",
        str(watched),
        str(watched / "victim"),
        f"{watched}/../x",
        str(watched / "link-to-root" / "etc"),
        "a\x00b",
        "x" * 4096,
        "ünï/cödé",
        "\n",
        "nqn.2014-08.org.x:a\n",
        f"nvmeof-v1.loop.{_UUID}",
        f"nvmeof-v1.store-a.{_UUID}",
        f"nvmeof-v1.loop.{_UUID.upper()}",
        f"nvmeof-snap-v1.loop.{_UUID}",
        f"nvmeof-v1..{_UUID}",
        "nvmeof-v1.loop.not-a-uuid",
        _UUID,
        f"nqn.2026-11.io.nvmeof:vol:{_UUID}",
        "nqn.2014-08.org.nvmexpress:uuid:" + _UUID,
        "-1",
        "9" * 40,
    ]
    return st.one_of(st.sampled_from(tricks), st.text(max_size=40))


def _scalar(field: FieldDescriptor, text: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    kind = field.type
    if kind == FieldDescriptor.TYPE_STRING:
        if field.name.endswith("secret"):
            return st.just(SECRET_MARKER)
        return text
    if kind == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind == FieldDescriptor.TYPE_ENUM:
        return st.sampled_from([v.number for v in _known(field.enum_type).values])
    if kind in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64):
        return st.one_of(
            st.sampled_from([0, -1, 1, 1 << 20, 1 << 30, 1 << 62, -(1 << 63)]), st.integers(-(1 << 63), (1 << 63) - 1)
        )
    if kind in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        return st.integers(0, (1 << 64) - 1)
    if kind in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SFIXED32):
        return st.integers(-(1 << 31), (1 << 31) - 1)
    if kind in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
        return st.integers(0, (1 << 32) - 1)
    return st.floats(allow_nan=False)


def _map_entries(field: FieldDescriptor, text: st.SearchStrategy[str]) -> st.SearchStrategy[dict[Any, Any]]:
    entry = _known(field.message_type)
    key_field, value_field = entry.fields_by_name["key"], entry.fields_by_name["value"]
    if field.name == "secrets":
        return st.dictionaries(st.sampled_from(["password", "key", "dhchap"]), st.just(SECRET_MARKER), max_size=2)
    keys = st.one_of(
        st.sampled_from(
            [
                "transport",
                "ctrlLossTmo",
                "queueSize",
                "tos",
                "dataset.uri",
                "dataset.path",
                "dataset.ttl",
                "csi.storage.k8s.io/pvc/name",
                "nqn",
                "namespaceUUID",
                "portals",
                "hostNqn",
                "readonly",
            ]
        ),
        text,
    )
    if key_field.type != FieldDescriptor.TYPE_STRING:
        keys = _scalar(key_field, text)
    values = _scalar(value_field, text) if value_field.type != FieldDescriptor.TYPE_MESSAGE else st.nothing()
    return st.dictionaries(keys, values, max_size=4)


def message(
    descriptor: Descriptor, cls: type[Message], text: st.SearchStrategy[str], depth: int = 3
) -> st.SearchStrategy[Message]:
    """Any ``cls`` message: each field is left unset or given a hostile value (sub-messages to ``depth``)."""
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for field in descriptor.fields:
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            if _known(field.message_type).GetOptions().map_entry:
                fields[field.name] = _map_entries(field, text)
                continue
            if depth <= 0:
                continue
            sub_cls = _concrete(cls, field)
            sub = message(_known(field.message_type), sub_cls, text, depth - 1)
            fields[field.name] = st.lists(sub, max_size=2) if _repeated(field) else sub
        elif _repeated(field):
            fields[field.name] = st.lists(_scalar(field, text), max_size=3)
        else:
            fields[field.name] = _scalar(field, text)

    @st.composite
    def build(draw: st.DrawFn) -> Message:
        msg = cls()
        for name, strategy in fields.items():
            if not draw(st.booleans()):
                continue
            value = draw(strategy)
            target = getattr(msg, name)
            if isinstance(value, dict):
                for k, v in value.items():
                    target[k] = v
            elif isinstance(value, list):
                if value and isinstance(value[0], Message):
                    for item in value:
                        target.add().CopyFrom(item)
                else:
                    target.extend(value)
            elif isinstance(value, Message):
                target.CopyFrom(value)
            else:
                setattr(msg, name, value)
        return msg

    return build()


D = TypeVar("D")


def _known(descriptor: D | None) -> D:
    """A field's message or enum type, which a message or enum field always has."""
    assert descriptor is not None
    return descriptor


def _repeated(field: FieldDescriptor) -> bool:
    return bool(field.is_repeated)


def _concrete(cls: type[Message], field: FieldDescriptor) -> type[Message]:
    """The Python class of a sub-message field (found through a fresh instance of ``cls``)."""
    sample = getattr(cls(), field.name)
    if _repeated(field):
        return type(sample.add())
    return type(sample)
