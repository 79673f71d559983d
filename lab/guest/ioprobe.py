"""I/O probe for failover tests (runs in the guest; standard library only).

usage: python3 ioprobe.py DEVICE SECONDS [--stall-ms 200] [--blocks 4096] [--mode verify|write|read]
                          [--timeline-ms 0] [--sync] [--stop-file PATH] [--tail 3]
       python3 ioprobe.py DEVICE 0 --mode check --acked N [--blocks 4096]

O_DIRECT 4 KiB I/O in a loop over the first BLOCKS blocks of DEVICE for SECONDS. In ``verify`` mode each
block is written with a pattern naming its sequence number and offset and read back at once; a mismatch is
a verify error (data corruption), an OSError an I/O error. Prints one JSON object: ios, io_errors,
verify_errors, max_gap_s (the longest time between two completions), stalls ([[start_s, gap_s], ...] over the
threshold), ios_after_last_stall (proves I/O resumed), seconds, and with ``--timeline-ms N`` a timeline: completions per
N ms bucket from the start (the I/O timeline a failover plot draws). ``--sync`` opens DEVICE with O_DSYNC: each
write is durable when it returns (FUA on a device with a volatile write cache), what must survive a power cut.
``--stop-file PATH`` ends the run early once PATH exists (looked for every 0.2 s) and I/O has flowed for
``--tail`` seconds since both the file appeared and the last stall ended: SECONDS is then an upper bound, and a
test whose fault is over need not wait it out (a probe asked to stop while its writes are frozen still shows
them resume).
``check`` reads every block back with O_DIRECT after a ``write`` run whose N writes were all acknowledged (no I/O
error): each block must hold the last of those writes that went to it; a mismatch is a verify error.
"""

import argparse
import json
import mmap
import os
import time

BS = 4096


def pattern(seq: int, offset: int) -> bytes:
    head = f"nvmeof-csi-probe seq={seq:016d} off={offset:016d} ".encode()
    return (head * (BS // len(head) + 1))[:BS]


def count(timeline: list[int], at_s: float, bucket_ms: float) -> None:
    """One completion at ``at_s`` into the per-bucket timeline (nothing when ``bucket_ms`` is 0)."""
    if bucket_ms > 0:
        bucket = int(at_s * 1000 / bucket_ms)
        timeline.extend([0] * (bucket + 1 - len(timeline)))
        timeline[bucket] += 1


class Stop:
    """When a run asked to stop through its stop file ends: once I/O has flowed for ``tail`` seconds since the
    file was first seen and since the last stall ended."""

    def __init__(self, path: str, tail: float, now: float) -> None:
        self.path, self.tail, self.asked, self.looked = path, tail, 0.0, now

    def due(self, now: float, resumed: float) -> bool:
        if self.path and not self.asked and now - self.looked >= 0.2:
            self.looked = now
            self.asked = now if os.path.exists(self.path) else 0.0
        return bool(self.asked) and now - max(self.asked, resumed) >= self.tail


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("device")
    ap.add_argument("seconds", type=float)
    ap.add_argument("--stall-ms", type=float, default=200.0)
    ap.add_argument("--blocks", type=int, default=4096)
    ap.add_argument("--mode", choices=("verify", "write", "read", "check"), default="verify")
    ap.add_argument("--acked", type=int, default=0)
    ap.add_argument("--timeline-ms", type=float, default=0.0)
    ap.add_argument("--sync", action="store_true")
    ap.add_argument("--stop-file", default="")
    ap.add_argument("--tail", type=float, default=3.0)
    return ap.parse_args()


def check(a: argparse.Namespace) -> None:
    fd = os.open(a.device, os.O_RDONLY | os.O_DIRECT)
    nblocks = max(1, min(os.lseek(fd, 0, os.SEEK_END) // BS, a.blocks))
    rbuf = mmap.mmap(-1, BS)
    checked = mismatches = 0
    errlog: list[list[object]] = []
    for b in range(min(nblocks, a.acked)):
        last = b + nblocks * ((a.acked - 1 - b) // nblocks)  # the last acknowledged write to block b
        os.preadv(fd, [rbuf], b * BS)
        checked += 1
        if rbuf[:] != pattern(last, b * BS):
            mismatches += 1
            if len(errlog) < 5:
                errlog.append([b, f"want seq {last}, found {bytes(rbuf[:60])!r}"])
    os.close(fd)
    print(
        json.dumps(
            {
                "ios": checked,
                "io_errors": 0,
                "verify_errors": mismatches,
                "errlog": errlog,
                "max_gap_s": 0.0,
                "stalls": [],
                "ios_after_last_stall": checked,
                "seconds": 0.0,
            }
        )
    )


def main() -> None:
    a = parse_args()
    if a.mode == "check":
        check(a)
        return
    flags = os.O_RDONLY if a.mode == "read" else os.O_RDWR
    fd = os.open(a.device, flags | os.O_DIRECT | (os.O_DSYNC if a.sync else 0))
    nblocks = max(1, min(os.lseek(fd, 0, os.SEEK_END) // BS, a.blocks))
    wbuf, rbuf = mmap.mmap(-1, BS), mmap.mmap(-1, BS)
    ios = io_errors = verify_errors = after_stall = 0
    errlog: list[list[object]] = []
    stalls: list[list[float]] = []
    max_gap = 0.0
    timeline: list[int] = []
    t0 = last = resumed = time.monotonic()
    seq = 0
    stop = Stop(a.stop_file, a.tail, t0)
    while time.monotonic() - t0 < a.seconds and not stop.due(time.monotonic(), resumed):
        off = (seq % nblocks) * BS
        try:
            if a.mode == "read":
                os.preadv(fd, [rbuf], off)
            else:
                wbuf[:] = pattern(seq, off)
                os.pwritev(fd, [wbuf], off)
                if a.mode == "verify":
                    os.preadv(fd, [rbuf], off)
                    if rbuf[:] != wbuf[:]:
                        verify_errors += 1
                        if len(errlog) < 5:
                            errlog.append([round(time.monotonic() - t0, 3), f"verify mismatch at {off}"])
            ios += 1
            after_stall += 1
            count(timeline, time.monotonic() - t0, a.timeline_ms)
        except OSError as e:
            io_errors += 1
            if len(errlog) < 5:
                errlog.append([round(time.monotonic() - t0, 3), str(e)])
            time.sleep(0.01)
        done = time.monotonic()
        gap = done - last
        max_gap = max(max_gap, gap)
        if gap * 1000 > a.stall_ms:
            stalls.append([round(last - t0, 3), round(gap, 3)])
            after_stall, resumed = 0, done
        last = done
        seq += 1
    os.close(fd)
    print(
        json.dumps(
            {
                "ios": ios,
                "io_errors": io_errors,
                "verify_errors": verify_errors,
                "errlog": errlog,
                "max_gap_s": round(max_gap, 4),
                "stalls": stalls[:50],
                "ios_after_last_stall": after_stall,
                "seconds": round(time.monotonic() - t0, 3),
                **({"timeline": timeline} if a.timeline_ms > 0 else {}),
            }
        )
    )


if __name__ == "__main__":
    main()
