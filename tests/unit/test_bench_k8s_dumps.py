"""bench/k8s_dumps.py: the process pattern reaches the guest as one argument, never a shell line."""

from __future__ import annotations

from collections.abc import Sequence

from bench.k8s_dumps import dumps, where
from lab.guest_calls import Result


class Guest:
    def __init__(self, pid: str) -> None:
        self.pid = pid
        self.ran: list[list[str]] = []

    def run(self, argv: Sequence[str], timeout: float = 60) -> Result:
        self.ran.append(list(argv))
        if argv[0] == "pgrep":
            return Result(0 if self.pid else 1, self.pid + "\n", "", 0.0)
        return Result(0, 'Thread 7 (idle): "asyncio_3"\n    wait (threading.py:320)\n', "", 0.0)


def test_the_pattern_is_one_argument_of_pgrep_and_the_pid_goes_to_py_spy() -> None:
    guest = Guest("4242")
    hostile = "--mode=controller'; reboot; echo '"
    got = dumps(guest, hostile, count=2, every=0)
    assert guest.ran[0] == ["pgrep", "-o", "-f", "--", hostile]
    assert guest.ran[1][-2:] == ["--pid", "4242"] and guest.ran[1][1:3] == ["dump", "--nonblocking"]
    assert len(got) == 2 and where(got[0]) == {"asyncio_N | - | wait (threading.py)": 1}


def test_no_process_found_gives_an_empty_dump_and_runs_no_py_spy() -> None:
    guest = Guest("")
    assert dumps(guest, "--mode=controller", count=1) == [""]
    assert [argv[0] for argv in guest.ran] == ["pgrep"]
