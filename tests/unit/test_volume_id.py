import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nvmeof_csi.csi import volume_id
from nvmeof_csi.errors import InvalidArgument, NotFound
from nvmeof_csi.service.contracts import VolumeRef

labels = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True)


@given(location=labels, raw=st.uuids())
def test_round_trip_and_length(location: str, raw: uuid.UUID) -> None:
    ref = VolumeRef(location, str(raw))
    encoded = volume_id.encode(ref)
    assert len(encoded.encode()) <= 128
    assert volume_id.decode(encoded) == ref


@given(st.text(min_size=1, max_size=128))
def test_garbage_is_not_found_or_invalid_never_crashes(text: str) -> None:
    try:
        ref = volume_id.decode(text)
    except (NotFound, InvalidArgument):
        return
    assert volume_id.encode(ref) == text  # anything accepted must be a canonical ID


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", InvalidArgument),
        ("x" * 129, InvalidArgument),
        ("some-vol-id", NotFound),
        ("nvmeof-v2.loop." + str(uuid.uuid4()), NotFound),
        ("nvmeof-v1.Loop." + str(uuid.uuid4()), NotFound),
        ("nvmeof-v1.loop.not-a-uuid", NotFound),
        ("nvmeof-v1.loop." + str(uuid.uuid4()).upper(), NotFound),
    ],
)
def test_rejects(text: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        volume_id.decode(text)


def test_encode_refuses_bad_location() -> None:
    with pytest.raises(ValueError, match="DNS label"):
        volume_id.encode(VolumeRef("Bad_Name", str(uuid.uuid4())))
