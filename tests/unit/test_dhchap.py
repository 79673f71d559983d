"""DH-HMAC-CHAP keys: DHHC-1 text form and random issue."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nvmeof_csi.errors import InvalidArgument
from nvmeof_csi.nvmeof.dhchap import format_key, generate_key, parse_key
from tests.support.env import need

HOST_A = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-0000-0000-000000000001"


@given(
    st.sampled_from([32, 48, 64]).flatmap(lambda n: st.binary(min_size=n, max_size=n)), st.sampled_from([0, 1, 2, 3])
)
def test_format_and_parse_are_inverse(key: bytes, transform: int) -> None:
    text = format_key(key, transform)
    assert text.startswith(f"DHHC-1:{transform:02x}:") and text.endswith(":")
    assert parse_key(text) == (key, transform)


@pytest.mark.parametrize(("byte", "length"), [(0x00, 32), (0xA5, 48), (0x3C, 64)])
def test_same_text_as_nvme_cli(byte: int, length: int) -> None:
    """The real peer: nvme-cli's gen-dhchap-key with the same key and no transformation."""
    need(shutil.which("nvme") is not None, "nvme-cli is installed by the lab set-up")
    out = subprocess.run(
        [
            "nvme",
            "gen-dhchap-key",
            f"--secret={bytes([byte]).hex() * length}",
            f"--key-length={length}",
            "--hmac=0",
            f"--nqn={HOST_A}",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.strip()
    assert format_key(bytes([byte]) * length) == out


@pytest.mark.parametrize(
    "text",
    [
        "",
        "DHHC-1:00:",
        "DHHC-2:00:AAAA:",
        "DHHC-1:07:" + format_key(bytes(32))[10:],
        format_key(bytes(32))[:-6] + "AAAA:",
        "DHHC-1:00:!!!!:",
    ],
)
def test_malformed_keys_are_refused_without_echoing_them(text: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_key(text)
    assert not text or text[10:30] not in str(info.value) or text[10:30] == ""


def test_generated_keys_are_random_32_byte_keys_without_transformation() -> None:
    keys = {generate_key() for _ in range(64)}
    assert len(keys) == 64
    assert all(parse_key(k)[1] == 0 and len(parse_key(k)[0]) == 32 for k in keys)
