"""The agent's authorization policy: parsing and the role table."""

from __future__ import annotations

from typing import Any

import pytest

from nvmeof_csi.agent.authz import ADMIN, ALLOWED, CONTROLLER, NODE, READER, needed_role, parse_policy
from nvmeof_csi.errors import ConfigError

NQN = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-0000-0000-000000000002"


def test_policy_maps_identities_to_roles() -> None:
    policy = parse_policy(
        {"clients": [{"identity": "c", "role": "controller"}, {"identity": "n", "role": "node", "hostNqn": NQN}]}
    )
    assert policy["c"].role == CONTROLLER and policy["n"].host_nqn == NQN


@pytest.mark.parametrize(
    "doc",
    [
        {},
        {"clients": "x"},
        {"clients": [{"identity": "a", "role": "root"}]},
        {"clients": [{"identity": "a", "role": "node"}]},  # a node needs its host NQN
        {"clients": [{"identity": "a", "role": "reader", "hostNqn": NQN}]},
        {"clients": [{"identity": "a", "role": "node", "hostNqn": NQN + "\n"}]},
        {"clients": [{"identity": "a", "role": "admin"}, {"identity": "a", "role": "reader"}]},
        {"clients": [{"identity": "a", "role": "admin", "extra": 1}]},
    ],
)
def test_malformed_policies_are_refused(doc: Any) -> None:
    with pytest.raises(ConfigError):
        parse_policy(doc)


def test_roles_are_nested_and_ana_is_admin_only() -> None:
    assert ALLOWED[NODE] - {"GetHostKeys"} < ALLOWED[READER] < ALLOWED[CONTROLLER]
    assert all("GetHostKeys" not in ALLOWED[r] for r in (READER, CONTROLLER))  # a node's own keys: the node only
    assert needed_role("GetHostKeys") == NODE and needed_role("RotateHostKey") == ADMIN
    assert all("SetAnaState" not in methods for methods in ALLOWED.values())
    assert [needed_role(m) for m in ("ListVolumes", "AllowHost", "SetAnaState")] == [READER, CONTROLLER, ADMIN]
