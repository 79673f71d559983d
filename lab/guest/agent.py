"""Guest side of the lab control channel. Runs inside the VM (standard library only, any Python 3.9+).

Protocol: newline-delimited JSON over the virtio-serial port named ``ctl``; each request runs in its own
thread, so a long command (an I/O probe) can run while others (fault injection) are issued.

Requests (every one carries ``id``; ``timeout`` in seconds is mandatory for commands):
  {"op": "exec", "argv": [...], "timeout": 30, "input": "", "cwd": "/", "env": {}}   run argv, no shell
  {"op": "sh", "cmd": "...", "timeout": 30}                                        bash -c (tests only)
  {"op": "write", "path": p, "data": s}  {"op": "read", "path": p}  {"op": "mkdir", "path": p}
  {"op": "rmdir", "path": p}  {"op": "unlink", "path": p}  {"op": "symlink", "src": s, "path": p}
  {"op": "listdir", "path": p}  {"op": "poweroff"}
Reply: {"id", "rc", "out", "err", "t"}; file operations answer rc 0 or the errno. On a command timeout the
whole process group is killed and rc is -9.

At start the agent mounts the scratch disk (``/dev/vda``: XFS with reflink, formatted only when blank) at
``/scratch``, gives the guest its unique host NQN and host ID (made once per scratch disk and kept there,
so a reboot keeps them), then announces
{"ready": true, ...}.
"""

import contextlib
import ctypes
import glob
import json
import os
import signal
import subprocess
import threading
import time
import uuid
from typing import Any

SCRATCH_DEV = "/dev/vda"
SCRATCH_DIR = "/scratch"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
Reply = dict[str, Any]


def find_port(name: str = "ctl") -> str | None:
    for d in glob.glob("/sys/class/virtio-ports/*"):
        try:
            with open(d + "/name") as f:
                if f.read().strip() == name:
                    return "/dev/" + os.path.basename(d)
        except OSError:
            pass
    return None


def run_argv(
    argv: list[str], timeout: float, stdin: str = "", cwd: str = "/", env: dict[str, str] | None = None
) -> Reply:
    environ = dict(os.environ, PATH=PATH, HOME="/root")
    environ.update(env or {})
    t0 = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=environ,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(stdin.encode(), timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:  # stuck in D state (I/O with all paths down): leave it
            out, err = b"", b""
        rc, err = -9, err + f"\n[agent] timeout after {timeout}s".encode()
    return {
        "rc": rc,
        "out": out.decode(errors="replace"),
        "err": err.decode(errors="replace"),
        "t": round(time.monotonic() - t0, 4),
    }


def file_op(req: dict[str, Any]) -> Reply:
    op, path = req["op"], req.get("path", "")
    try:
        out = ""
        if op == "write":
            with open(path, "w") as f:
                f.write(req["data"])
        elif op == "read":
            with open(path) as f:
                out = f.read()
        elif op == "mkdir":
            os.makedirs(path, exist_ok=True)
        elif op == "rmdir":
            os.rmdir(path)
        elif op == "unlink":
            os.unlink(path)
        elif op == "symlink":
            os.symlink(req["src"], path)
        elif op == "listdir":
            out = "\n".join(sorted(os.listdir(path)))
        else:
            return {"rc": 22, "out": "", "err": f"unknown op {op!r}"}
        return {"rc": 0, "out": out, "err": ""}
    except OSError as e:
        return {"rc": e.errno or 1, "out": "", "err": f"{op} {path}: {e.strerror}"}


def identity() -> tuple[str, str]:
    """This guest's host NQN and host ID: generated once per scratch disk (QEMU has no DMI UUID, and clones
    must never share one) and kept there, so the guest keeps its identity across reboots like a real node."""
    saved = os.path.join(SCRATCH_DIR, ".lab-host-identity")
    host_id = ""
    if os.path.ismount(SCRATCH_DIR):
        with contextlib.suppress(OSError, ValueError), open(saved) as f:
            host_id = str(uuid.UUID(f.read().strip()))
    if not host_id:
        host_id = str(uuid.uuid4())
        if os.path.ismount(SCRATCH_DIR):
            with open(saved, "w") as f:
                f.write(host_id + "\n")
                f.flush()
                os.fsync(f.fileno())
    os.makedirs("/etc/nvme", exist_ok=True)
    with open("/etc/nvme/hostid", "w") as f:
        f.write(host_id + "\n")
    nqn = "nqn.2014-08.org.nvmexpress:uuid:" + host_id
    with open("/etc/nvme/hostnqn", "w") as f:
        f.write(nqn + "\n")
    return nqn, host_id


def scratch() -> str:
    if not os.path.exists(SCRATCH_DEV):
        return "absent"
    state = "mounted"
    probe = run_argv(["blkid", "-p", "-o", "value", "-s", "TYPE", SCRATCH_DEV], 30)
    if probe["rc"] == 2:
        mk = run_argv(["mkfs.xfs", "-q", "-m", "reflink=1", SCRATCH_DEV], 120)
        if mk["rc"]:
            return "mkfs failed: " + str(mk["err"])
        state = "formatted"
    os.makedirs(SCRATCH_DIR, exist_ok=True)
    m = run_argv(["mount", "-t", "xfs", SCRATCH_DEV, SCRATCH_DIR], 60)
    return state if m["rc"] == 0 else "mount failed: " + m["err"]


class Channel:
    """The virtio-serial port: framed JSON lines out (thread-safe), requests in, one thread per request."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.lock = threading.Lock()

    def send(self, obj: Reply) -> None:
        data = (json.dumps(obj) + "\n").encode()
        with self.lock:
            while data:
                data = data[os.write(self.fd, data) :]

    def handle(self, req: dict[str, Any]) -> None:
        rid, op = req.get("id"), req.get("op", "exec")
        t0 = time.monotonic()
        try:
            if op == "poweroff":
                self.send({"id": rid, "rc": 0, "out": "", "err": "", "t": 0})
                os.sync()
                ctypes.CDLL(None, use_errno=True).reboot(0x4321FEDC)  # LINUX_REBOOT_CMD_POWER_OFF
                return
            if op == "exec":
                res = run_argv(req["argv"], req["timeout"], req.get("input", ""), req.get("cwd", "/"), req.get("env"))
            elif op == "sh":
                res = run_argv(["/bin/bash", "-c", req["cmd"]], req["timeout"], req.get("input", ""))
            else:
                res = file_op(req)
        except Exception as e:  # report, never die: the agent is the only way in
            res = {"rc": -1, "out": "", "err": f"[agent] {e!r}"}
        res["id"] = rid
        res.setdefault("t", round(time.monotonic() - t0, 4))
        self.send(res)

    def serve(self) -> None:
        buf = b""
        while True:
            chunk = os.read(self.fd, 65536)
            if not chunk:
                time.sleep(0.05)  # host side not connected (yet / any more)
                continue
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if not line.strip():
                    continue
                try:
                    req = json.loads(line)
                except ValueError:
                    self.send({"id": None, "rc": -1, "out": "", "err": "[agent] bad json"})
                    continue
                threading.Thread(target=self.handle, args=(req,), daemon=True).start()


def main() -> None:
    os.environ["PATH"] = PATH
    port = None
    for _ in range(200):
        port = find_port()
        if port and os.path.exists(port):
            break
        time.sleep(0.05)
    if port is None:
        raise SystemExit("lab agent: no virtio-serial port named 'ctl'")
    channel = Channel(os.open(port, os.O_RDWR))
    run_argv(["ip", "link", "set", "lo", "up"], 10)
    scratch_state = scratch()
    nqn, host_id = identity()
    with open("/proc/uptime") as f:
        up = float(f.read().split()[0])
    channel.send(
        {
            "id": 0,
            "ready": True,
            "uptime": up,
            "kernel": os.uname().release,
            "hostnqn": nqn,
            "hostid": host_id,
            "scratch": scratch_state,
        }
    )
    channel.serve()


if __name__ == "__main__":
    main()
