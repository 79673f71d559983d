"""Only one controller replica signs (security round 3, point 2): replicas elect a leader through a Lease; the
others stand by and count as alive. A leader that cannot renew stops at once; another takes over only after
the Lease's duration without a renewal, and a race between two replicas has one winner (resourceVersion)."""

from __future__ import annotations

import datetime
import threading
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry

from nvmeof_csi.issuance.signer import IdentitySigner
from nvmeof_csi.kube.lease import LeaseElector
from tests.support.leases import Leases
from tests.support.node_ca import NOW


def electors(api: Leases, now: list[datetime.datetime]) -> tuple[LeaseElector, LeaseElector]:
    return tuple(  # type: ignore[return-value]
        LeaseElector(api, "nvmeof-csi", "signer", who, duration=30, clock=lambda: now[0]) for who in ("a", "b")
    )


def test_one_replica_leads_renews_and_another_takes_over_only_after_the_duration() -> None:
    api, now = Leases(), [NOW]
    a, b = electors(api, now)
    assert a.lead() is True and b.lead() is False
    now[0] += datetime.timedelta(seconds=20)
    assert a.lead() is True and b.lead() is False  # renewed at 20 s
    acquired = api.spec("signer")["acquireTime"]
    now[0] += datetime.timedelta(seconds=29)
    assert b.lead() is False  # 29 s since a's renewal
    now[0] += datetime.timedelta(seconds=2)
    assert b.lead() is True and a.lead() is False  # a stopped renewing for 31 s: b took it over
    assert api.spec("signer")["holderIdentity"] == "b" and api.spec("signer")["acquireTime"] != acquired


def test_a_released_lease_is_taken_at_once_and_only_its_holder_releases_it() -> None:
    api, now = Leases(), [NOW]
    a, b = electors(api, now)
    assert a.lead() is True
    b.release()  # b never led: it writes nothing
    assert api.spec("signer")["holderIdentity"] == "a" and b.lead() is False
    a.release()
    assert api.spec("signer")["holderIdentity"] == ""
    now[0] += datetime.timedelta(seconds=1)
    assert b.lead() is True  # at once, not 30 s after a's last renewal
    a.release()  # a no longer leads: b's Lease is untouched
    assert api.spec("signer")["holderIdentity"] == "b" and a.lead() is False


def test_a_leader_that_cannot_renew_stops_at_once_and_a_race_has_one_winner() -> None:
    api, now = Leases(), [NOW]
    a, b = electors(api, now)
    assert a.lead()
    api.down = True
    assert a.lead() is False  # it cannot tell it still leads: it stops signing
    api.down = False
    now[0] += datetime.timedelta(seconds=31)
    original = api.read_namespaced_lease

    def raced(name: str, namespace: str, **kw: Any) -> SimpleNamespace:
        found = original(name, namespace, **kw)
        api.read_namespaced_lease = original  # type: ignore[method-assign]
        assert b.lead() is True  # b takes the stale Lease between a's read and a's write
        return found

    api.read_namespaced_lease = raced  # type: ignore[method-assign]
    assert a.lead() is False and api.spec("signer")["holderIdentity"] == "b"


def test_a_standby_signer_runs_no_pass_and_stays_alive() -> None:
    leading, clock = [False], [100.0]

    def lead() -> bool:  # the loop asks the lease at every turn; each turn is 10 s here
        clock[0] += 10
        return leading[0]

    signer = IdentitySigner(None, {}, (b"", b""), monotonic=lambda: clock[0], stale_after=60, leader=lead)
    registry = CollectorRegistry()
    registry.register(signer)
    stop = threading.Event()
    loop = threading.Thread(target=signer.run, args=(stop, 0.01))
    loop.start()
    try:
        while clock[0] < 300:
            stop.wait(0.01)
        assert registry.get_sample_value("nvmeof_csi_identity_signer_passes_total") == 0
        assert signer.health().ready  # 200 s standing by: alive, and no pass
        assert registry.get_sample_value("nvmeof_csi_identity_signer_leading") == 0
        leading[0] = True
        while not registry.get_sample_value("nvmeof_csi_identity_signer_passes_total"):
            stop.wait(0.01)
        assert registry.get_sample_value("nvmeof_csi_identity_signer_leading") == 1
    finally:
        stop.set()
        loop.join(5)
