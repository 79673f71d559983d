import threading
import time

import pytest

from nvmeof_csi.csi.locks import CSI_LOCK_TABLE as LOCK_TABLE
from nvmeof_csi.errors import Aborted
from nvmeof_csi.rpc.locks import KeyedLocks, KeyedMutex


def test_second_holder_is_aborted_and_entry_removed_on_release() -> None:
    locks = KeyedLocks()
    with locks.hold("volume_id=a"):
        assert locks.held() == {"volume_id=a"}
        with pytest.raises(Aborted, match="volume_id=a"), locks.hold("volume_id=a"):
            pass
        with locks.hold("volume_id=b"):  # other keys are independent
            pass
    assert locks.held() == frozenset()


def test_all_or_nothing() -> None:
    locks = KeyedLocks()
    with locks.hold("b"):
        with pytest.raises(Aborted), locks.hold("a", "b"):
            pass
        assert locks.held() == {"b"}  # "a" was not left behind


def test_released_after_exception() -> None:
    locks = KeyedLocks()
    with pytest.raises(RuntimeError), locks.hold("k"):
        raise RuntimeError("boom")
    assert locks.held() == frozenset()


def test_threads_exactly_one_wins() -> None:
    locks = KeyedLocks()
    start = threading.Barrier(8)
    inside = threading.Event()
    release = threading.Event()
    results: list[str] = []

    def worker() -> None:
        start.wait()
        try:
            with locks.hold("same"):
                inside.set()
                release.wait(5)
                results.append("won")
        except Aborted:
            results.append("aborted")

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    assert inside.wait(5)
    deadline = time.monotonic() + 10  # the winner holds the lock until all seven others have been refused
    while results.count("aborted") < 7 and time.monotonic() < deadline:
        time.sleep(0.01)
    release.set()
    for t in threads:
        t.join()
    assert results.count("won") == 1 and results.count("aborted") == 7, results
    assert locks.held() == frozenset()


def test_table_names_real_request_fields() -> None:
    from nvmeof_csi.gen import csi_pb2

    services = {s.name: s for s in csi_pb2.DESCRIPTOR.services_by_name.values()}
    for method, fields in LOCK_TABLE.items():
        _, service, rpc = method.split("/")
        desc = services[service.split(".")[-1]].methods_by_name[rpc]
        for f in fields:
            assert f in desc.input_type.fields_by_name, (method, f)


def test_a_keyed_mutex_with_a_wait_gives_up_whole_and_leaves_no_key_held() -> None:
    mutex = KeyedMutex()
    held = threading.Event()
    release = threading.Event()

    def holder() -> None:
        with mutex.hold("b"):
            held.set()
            release.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    assert held.wait(10)
    with pytest.raises(Aborted, match=r"'b' is still in progress after 0\.1 s"), mutex.hold("a", "b", wait=0.1):
        pass
    with mutex.hold("a", wait=0.1):  # "a" was let go when "b" could not be had
        pass
    release.set()
    thread.join(10)
    with mutex.hold("a", "b", wait=0.1):
        pass
    assert mutex.size() == 0
