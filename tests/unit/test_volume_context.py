"""nvmeof/context.py: the portal list a volume context carries (``trtype:traddr:trsvcid``, comma-separated)."""

from __future__ import annotations

import pytest

from nvmeof_csi.errors import InvalidArgument
from nvmeof_csi.nvmeof.context import parse_portals


@pytest.mark.parametrize("text", ["tcp:1.2.3.4", "fc:1.2.3.4:1", "tcp::4420", "tcp:127.0.0.1:notaport"])
def test_a_malformed_portal_is_invalid_argument(text: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_portals(text)


def test_an_ipv6_portal_keeps_its_address_without_brackets() -> None:
    (portal,) = parse_portals("tcp:[fd00::1]:4420")
    assert (portal.trtype, portal.traddr, portal.trsvcid) == ("tcp", "fd00::1", "4420")
