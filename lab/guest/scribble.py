"""Tagged block writes for the fencing proofs (runs in the guest; standard library only).

usage: python3 scribble.py write DEVICE SECONDS TAG [--marker PATH [--after S]] [--blocks N] [--first N]
       python3 scribble.py fill DEVICE TAG
       python3 scribble.py count FILE TAG

Every 4 KiB block written holds ``TAG`` and its block number, so the blocks of a backing file can be told apart
by writer afterwards (``count``). ``write`` keeps writing for SECONDS over N blocks of DEVICE from block
``--first`` (0), in turn
with O_DIRECT and through the page cache (an fsync after every 16 buffered writes): both ways a fenced node could
still reach the volume. Once ``--marker`` exists (made by the test when the fence has returned) it counts what
still succeeded: ``direct_after`` (O_DIRECT writes issued after the marker that returned success) and
``fsync_after`` (fsyncs after the marker that succeeded): both must stay 0 on a fenced node; with ``--after S``
it ends S seconds after it saw the marker (long enough for the host's reconnect attempts) if SECONDS is not
over first. Prints one JSON
object at the end; a write that blocks is left to the kernel (the caller bounds the wait). ``fill`` writes every
block of DEVICE once with O_DIRECT and fsyncs; ``count`` prints how many blocks of FILE carry TAG.
"""

import argparse
import json
import mmap
import os
import time

BS = 4096


def block(tag: str, number: int) -> bytes:
    head = f"{tag} block={number:012d} ".encode()
    return (head * (BS // len(head) + 1))[:BS]


def size_of(path: str) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)


def write(
    device: str, seconds: float, tag: str, marker: str, blocks: int, first: int = 0, after: float = 0.0
) -> dict[str, int]:
    blocks = min(blocks, size_of(device) // BS - first)
    direct = os.open(device, os.O_WRONLY | os.O_DIRECT)
    cached = os.open(device, os.O_WRONLY)
    buf = mmap.mmap(-1, BS)
    out = {"direct_ok": 0, "direct_err": 0, "fsync_ok": 0, "fsync_err": 0, "direct_after": 0, "fsync_after": 0}
    end, number, fenced = time.monotonic() + seconds, first, False
    while time.monotonic() < end:
        if not fenced and marker and os.path.exists(marker):
            fenced = True
            if after > 0:
                end = min(end, time.monotonic() + after)
        number = first + (number - first + 1) % blocks
        try:
            if number % 2 == 0:
                buf[:] = block(tag, number)
                os.pwritev(direct, [buf], number * BS)
                out["direct_ok"] += 1
                out["direct_after"] += int(fenced)
            else:
                os.pwrite(cached, block(tag, number), number * BS)
                if number % 32 == 1:
                    os.fsync(cached)
                    out["fsync_ok"] += 1
                    out["fsync_after"] += int(fenced)
        except OSError:
            out["direct_err" if number % 2 == 0 else "fsync_err"] += 1
            time.sleep(0.05)
    out["fenced_seen"] = int(fenced)
    return out


def fill(device: str, tag: str) -> dict[str, int]:
    fd = os.open(device, os.O_WRONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, BS)
    total = size_of(device) // BS
    for number in range(total):
        buf[:] = block(tag, number)
        os.pwritev(fd, [buf], number * BS)
    os.fsync(fd)
    os.close(fd)
    return {"blocks": total}


def count(path: str, tag: str) -> dict[str, int]:
    needle, found, total = f"{tag} block=".encode(), 0, 0
    with open(path, "rb") as f:
        while chunk := f.read(BS):
            total += 1
            found += chunk.startswith(needle)
    return {"blocks": total, "tagged": found}


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("device")
    w.add_argument("seconds", type=float)
    w.add_argument("tag")
    w.add_argument("--marker", default="")
    w.add_argument("--after", type=float, default=0.0)
    w.add_argument("--blocks", type=int, default=4096)
    w.add_argument("--first", type=int, default=0)
    f = sub.add_parser("fill")
    f.add_argument("device")
    f.add_argument("tag")
    c = sub.add_parser("count")
    c.add_argument("file")
    c.add_argument("tag")
    args = ap.parse_args()
    if args.cmd == "write":
        result = write(args.device, args.seconds, args.tag, args.marker, args.blocks, args.first, args.after)
    elif args.cmd == "fill":
        result = fill(args.device, args.tag)
    else:
        result = count(args.file, args.tag)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
