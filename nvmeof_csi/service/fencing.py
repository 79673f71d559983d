"""When the controller fences a node from a volume instead of only revoking its grant, and when a fenced node
may have the volume again.

A plain unpublish takes the node out of the volume's allow-list; the target checks that list only at connect, so
a node that still has a connection keeps writing. That is right when the node cleaned up (it disconnected
before the CO called), wrong when the CO gave up on the node. CSI 1.14 says which: the unpublish ``reason``.
Kubernetes 1.37's external-attacher does not send one yet, so the out-of-service taint on the Node
(``node.kubernetes.io/out-of-service``, the operator's word that the node is off) counts too.

Decision table (``fence_on`` is the controller's ``--fence-on`` setting; default all three):

| reason | node tainted | fences when ``fence_on`` holds | recorded reason |
|---|---|---|---|
| ``NODE_OUT_OF_SERVICE`` | any (not read) | ``NODE_OUT_OF_SERVICE`` | NODE_OUT_OF_SERVICE |
| ``NODE_CLEANUP_TIMEOUT`` | any (not read) | ``NODE_CLEANUP_TIMEOUT`` | NODE_CLEANUP_TIMEOUT |
| ``NODE_CLEANUP_SUCCEEDED`` | any (not read) | never: the node let go | |
| unset, or a listed reason not in ``fence_on`` | yes | ``taint`` | OUT_OF_SERVICE_TAINT |
| unset, or a listed reason not in ``fence_on`` | no, or no cluster | never | |

A fenced node gets the volume again (``publish`` lifts the fence) only when it reports a boot ID other than the
one recorded at the fence, i.e. it rebooted and lost every connection and dirty page it had; otherwise
``FailedPrecondition`` until an operator runs ``nvmeofctl hosts unfence``.

Contract: :func:`fence_reason` and :func:`may_unfence` are pure; a :class:`NodeFacts` answers ``None`` / ``""``
when it cannot know (no Kubernetes) and raises ``Unavailable`` when it should know but cannot ask.
"""

from __future__ import annotations

from typing import Protocol

from nvmeof_csi.errors import ConfigError

OUT_OF_SERVICE, CLEANUP_TIMEOUT, CLEANUP_SUCCEEDED = (
    "NODE_OUT_OF_SERVICE",
    "NODE_CLEANUP_TIMEOUT",
    "NODE_CLEANUP_SUCCEEDED",
)
TAINT, TAINT_REASON = "taint", "OUT_OF_SERVICE_TAINT"
FENCE_ON_CHOICES = (OUT_OF_SERVICE, CLEANUP_TIMEOUT, TAINT)


class NodeFacts(Protocol):
    """What the cluster says about a node, by its CSI node ID."""

    def out_of_service(self, node_id: str) -> bool | None:
        """Whether the node carries the out-of-service taint; ``None`` when there is no cluster to ask."""
        ...

    def boot_id(self, node_id: str) -> str:
        """The node's current boot ID as it reports it; ``""`` when unknown."""
        ...

    def claimed_by(self, node_id: str) -> list[str]:
        """The names of the Nodes whose CSINode lists ``node_id`` for this driver (two or more: one host identity
        on several machines, a cloned ``/etc/nvme/hostnqn``); ``[]`` when there is no cluster to ask. Raises
        ``Unavailable`` when the cluster cannot be asked."""
        ...

    def node_of(self, node_id: str) -> str:
        """The name of the Node that ``node_id`` is (the one its identity was issued to, else its one
        claimant); ``""`` when unknown. Raises ``Unavailable`` when the cluster cannot be asked."""
        ...


class NoCluster:
    """Outside Kubernetes (csi-sanity, ``serve --mode all``): no taint, no boot ID."""

    def out_of_service(self, node_id: str) -> bool | None:
        return None

    def boot_id(self, node_id: str) -> str:
        return ""

    def claimed_by(self, node_id: str) -> list[str]:
        return []

    def node_of(self, node_id: str) -> str:
        return ""


def fence_reason(reason: str, fence_on: frozenset[str], tainted: bool | None) -> str:
    """The reason to record when this unpublish must fence, else ``""`` (see the table). ``tainted`` is read
    only for the rows that need it: pass ``None`` when it was not read."""
    if reason == CLEANUP_SUCCEEDED:
        return ""
    if reason in (OUT_OF_SERVICE, CLEANUP_TIMEOUT) and reason in fence_on:
        return reason
    if TAINT in fence_on and tainted:
        return TAINT_REASON
    return ""


def needs_taint(reason: str, fence_on: frozenset[str]) -> bool:
    """Whether :func:`fence_reason` depends on the taint for this reason (so the Node must be read)."""
    return (
        TAINT in fence_on
        and reason != CLEANUP_SUCCEEDED
        and not (reason in (OUT_OF_SERVICE, CLEANUP_TIMEOUT) and reason in fence_on)
    )


def may_unfence(recorded_boot_id: str, current_boot_id: str) -> bool:
    """A fenced node may have the volume again when both boot IDs are known and differ (it rebooted)."""
    return bool(recorded_boot_id and current_boot_id and recorded_boot_id != current_boot_id)


def parse_fence_on(text: str) -> frozenset[str]:
    """``--fence-on``: a comma-separated subset of :data:`FENCE_ON_CHOICES`; ``none`` (or empty) fences never."""
    items = {i.strip() for i in text.split(",") if i.strip()} - {"none"}
    unknown = sorted(items - set(FENCE_ON_CHOICES))
    if unknown:
        raise ConfigError(f"--fence-on: unknown {', '.join(unknown)} (choose from {', '.join(FENCE_ON_CHOICES)}, none)")
    return frozenset(items)
