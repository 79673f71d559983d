"""Host side of the guest I/O probe (``lab/guest/ioprobe.py``): start it in the background, read its result."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field

from lab.build import LAB_DIR
from lab.vm import GuestError, LabVM, Pending

PROBE = LAB_DIR / "guest" / "ioprobe.py"


@dataclass(frozen=True)
class ProbeResult:
    ios: int
    io_errors: int
    verify_errors: int
    max_gap_s: float
    stalls: list[list[float]]
    ios_after_last_stall: int
    seconds: float
    errlog: list[list[object]]
    timeline: list[int] = field(default_factory=list)  # completions per ``timeline_ms`` bucket (when asked)

    @property
    def errors(self) -> int:
        return self.io_errors + self.verify_errors

    def line(self) -> str:
        return (
            f"ios={self.ios} errors={self.errors} (io={self.io_errors} verify={self.verify_errors}) "
            f"longest_stall={self.max_gap_s:.3f}s stalls={self.stalls[:3]} resumed_ios={self.ios_after_last_stall}"
        )


class IoProbe:
    """An I/O probe running on a guest device."""

    def __init__(
        self,
        vm: LabVM,
        device: str,
        seconds: float,
        stall_ms: float = 200.0,
        timeline_ms: float = 0.0,
        sync: bool = False,
        blocks: int = 4096,
    ) -> None:
        """``sync``: every write durable when it returns (O_DSYNC), for faults that cut the target's power.
        ``seconds`` is how long it runs unless :meth:`stop` ends it sooner."""
        self.device, self.seconds, self._vm = device, seconds, vm
        self._stop_file = f"/tmp/ioprobe-{secrets.token_hex(6)}.stop"
        argv = [
            vm.python,
            str(PROBE),
            device,
            str(seconds),
            "--stall-ms",
            str(stall_ms),
            "--timeline-ms",
            str(timeline_ms),
            "--blocks",
            str(blocks),
            *(["--sync"] if sync else []),
            "--stop-file",
            self._stop_file,
        ]
        self._pending: Pending = vm.submit(argv, timeout=seconds + 180)

    def result(self) -> ProbeResult:
        out = self._pending.check()
        try:
            doc = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError) as exc:
            raise GuestError("ioprobe output", self._pending.wait()) from exc
        return ProbeResult(**doc)

    def stop(self) -> ProbeResult:
        """End the run before its ``seconds`` and give its result: the probe goes on until its I/O has flowed for
        its tail (3 s) since this call and since its last stall ended (a write frozen now must still be seen to
        complete), then reports, as :meth:`result`. For a test whose fault is over: the rest of the run would
        only be waited out."""
        self._vm.write(self._stop_file, "")
        try:
            return self.result()
        finally:
            self._vm.unlink(self._stop_file)
