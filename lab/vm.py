"""Host side of the lab: boot the QEMU VM and drive its guest agent.

Contract:
- :meth:`LabVM.start` boots and returns once the guest agent is ready (or raises :class:`LabError` with the
  console tail). :meth:`LabVM.stop` always leaves no QEMU process behind (poweroff, then terminate, then
  kill); QEMU also gets SIGKILL if this Python process dies (PR_SET_PDEATHSIG).
- Every guest command has a timeout; the host waits at most that long plus a margin, then raises
  :class:`GuestTimeout`. :meth:`LabVM.submit` runs a command in the background and returns a handle.
- :meth:`LabVM.reboot` power-cycles the VM; the scratch disk (a sparse image on the host) survives it.
- The VM has no network card; traffic stays inside the guest.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lab.build import LAB_DIR, BuildInfo
from lab.guest_calls import BootCrash, BootHang, GuestError, GuestTimeout, LabError, Pending, Result, VMExited
from lab.host import VM_NAME, copy_disk, die_with_parent, kvm_usable

# fmt: off
__all__ = ["TCG_SAFE_BOOT", "BootCrash", "BootHang", "GuestError", "GuestTimeout", "LabError", "LabVM", "Pending",
           "Result", "VMExited"]
# fmt: on

AGENT = LAB_DIR / "guest" / "agent.py"


#: Kernel arguments for a guest under TCG on a busy host: ``no_timer_check`` skips the boot-time IO-APIC timer
#: probe, which panics ("IO-APIC + timer doesn't work!") when the vCPU is descheduled through it (2 of 3 boots
#: while the host was busy); ``tsc=reliable`` takes the TSC off the clocksource watchdog (QEMU derives the
#: guest TSC from the host clock: monotonic and the same on every vCPU), so a stalled vCPU can never read as
#: skew and get the TSC marked unstable at run time, which flips the ``sched_clock`` static key: TCG's
#: cross-CPU code patching has oopsed the kernel on that key (``int3`` in ``sched_clock_cpu``).
TCG_SAFE_BOOT = ("no_timer_check", "tsc=reliable")


class LabVM:
    """One lab VM. Use as a context manager, or call :meth:`start` and :meth:`stop`."""

    def __init__(
        self,
        mem_mb: int = 2048,
        cpus: int = 2,
        scratch_gb: int = 8,
        boot_timeout: float | None = None,
        kernel: str | None = None,
        nic: Sequence[str] = (),
        scratch_from: Path | None = None,
        pass_fds: Sequence[int] = (),
    ) -> None:
        """``nic``: QEMU arguments for a network card (the Kubernetes tier's restricted user network); the
        default is none. ``scratch_from``: a saved scratch disk this VM starts from (a sparse copy; its size
        must be ``scratch_gb``); the default is a blank disk. ``pass_fds``: file descriptors QEMU inherits (the tap
        devices ``nic`` names by ``fd=``), again at every boot. QEMU's QMP socket is :attr:`qmp_socket`."""
        self.info = BuildInfo.load(kernel)
        self.mem_mb, self.cpus = mem_mb, cpus
        self.nic = list(nic) or ["-nic", "none"]
        self.pass_fds = tuple(pass_fds)
        self.accel = os.environ.get("LAB_ACCEL") or ("kvm" if kvm_usable() else "tcg")
        self.boot_timeout = boot_timeout or (60.0 if self.accel == "kvm" else 300.0)
        self.rundir = Path(tempfile.mkdtemp(prefix="labvm-"))
        self.scratch = self.rundir / "scratch.img"
        if scratch_from is not None:
            copy_disk(scratch_from, self.scratch).check_returncode()
        with open(self.scratch, "ab") as img:
            img.truncate(scratch_gb << 30)
        self.console_log = self.rundir / "console.log"
        self.qmp_socket = self.rundir / "qmp.sock"
        self.proc: subprocess.Popen[bytes] | None = None
        self.residents: dict[str, object] = {}  # the resident clients in this VM by socket (lab/csi_client.py)
        self._sock: socket.socket | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, Pending] = {}
        self._lock = threading.Lock()
        self.boot_seconds = 0.0
        self.ready: dict[str, Any] = {}

    # -- lifecycle ---------------------------------------------------------------------------------------
    def _argv(self, sock: Path) -> list[str]:
        if self.accel == "kvm":
            accel = ["-accel", "kvm", "-cpu", "host"]
        else:
            accel = ["-accel", "tcg,thread=multi", "-cpu", "max"]
        qboot = Path("/usr/share/qemu/qboot.rom")
        python = os.environ.get("LAB_GUEST_PYTHON", "/usr/bin/python3")
        append = f"console=ttyS0 quiet panic=-1 {' '.join(TCG_SAFE_BOOT)} lab.agent={AGENT} lab.python={python}"
        # fmt: off
        return [
            "qemu-system-x86_64", "-name", VM_NAME, *accel, *(["-bios", str(qboot)] if qboot.exists() else []),
            "-M", "q35", "-m", str(self.mem_mb), "-smp", str(self.cpus),
            "-nodefaults", "-no-user-config", "-nographic", "-no-reboot", *self.nic,
            "-kernel", self.info.vmlinuz, "-initrd", self.info.initrd, "-append", append,
            "-serial", f"file:{self.console_log}",
            "-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
            "-drive", f"file={self.scratch},if=virtio,format=raw,cache=writeback,discard=unmap",
            "-device", "virtio-serial-pci",
            "-chardev", f"socket,id=ctl,path={sock},server=on,wait=on",
            "-device", "virtserialport,chardev=ctl,name=ctl",
            "-qmp", f"unix:{self.qmp_socket},server=on,wait=off",
        ]
        # fmt: on

    def start(self) -> LabVM:
        """Boot and wait for the guest agent. A guest kernel that crashes while booting, before anything of ours
        ran in it, is booted once more (TCG's cross-CPU code patching has oopsed the 6.12 kernel at boot: ``int3``
        in ``sched_clock_cpu``), and so is one that hangs silently past the boot timeout; the failed boot's console
        is printed to stderr. A second failure is raised."""
        try:
            return self._boot()
        except BootCrash as crash:
            print(f"lab: the guest kernel crashed while booting; booting it once more. {crash}", file=sys.stderr)
            return self._boot()
        except BootHang as hang:
            print(f"lab: the guest hung while booting; booting it once more. {hang}", file=sys.stderr)
            return self._boot()

    def _boot(self) -> LabVM:
        sock_path = self.rundir / "ctl.sock"
        sock_path.unlink(missing_ok=True)
        t0 = time.monotonic()
        with open(self.rundir / "qemu.out", "ab") as qemu_out:
            self.proc = subprocess.Popen(
                self._argv(sock_path),
                stdin=subprocess.DEVNULL,
                stdout=qemu_out,
                stderr=subprocess.STDOUT,
                pass_fds=self.pass_fds,
                preexec_fn=die_with_parent,  # noqa: PLW1509 - only prctl, no locks taken
            )
        sock = socket.socket(socket.AF_UNIX)
        while True:  # QEMU waits (wait=on) for us before it runs the guest
            try:
                sock.connect(str(sock_path))
                break
            except OSError:
                if self.proc.poll() is not None:
                    raise LabError("qemu exited: " + self._tail("qemu.out")) from None
                if time.monotonic() - t0 > 30:
                    self.stop()
                    raise LabError("qemu control socket never appeared") from None
                time.sleep(0.02)
        self._sock = sock
        ready: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._reader, args=(sock, ready), daemon=True).start()
        while True:
            try:
                self.ready = ready.get(timeout=0.5)
                break
            except queue.Empty:
                if self.proc.poll() is not None or time.monotonic() - t0 > self.boot_timeout:
                    crashed = self.proc.poll() is not None
                    why = "qemu exited" if crashed else f"timeout {self.boot_timeout:.0f}s"
                    self.stop()
                    error = BootCrash if crashed else BootHang
                    tails = f"console:\n{self._tail('console.log')}\nqemu:\n{self._tail('qemu.out')}"
                    raise error(f"guest agent not ready ({why}); {tails}") from None
        self.boot_seconds = time.monotonic() - t0
        if not str(self.ready.get("scratch", "")).startswith(("mounted", "formatted")):
            raise LabError(f"scratch disk not usable in the guest: {self.ready.get('scratch')}")
        return self

    def _reader(self, sock: socket.socket, ready: queue.Queue[dict[str, Any]]) -> None:
        with contextlib.suppress(OSError), sock.makefile("rb") as lines:  # a reset is the end too
            for line in lines:
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if msg.get("ready"):
                    ready.put(msg)
                    continue
                with self._lock:
                    pending = self._pending.pop(msg.get("id"), None)
                if pending is not None:
                    pending._box.put(msg)
        with self._lock:  # connection gone: wake every waiter
            waiting = list(self._pending.values())
            self._pending.clear()
        if not waiting:
            return
        if self.proc is not None:  # a guest that panicked ends QEMU (panic=-1, -no-reboot): wait for it to say so
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
        why = "[host] guest connection closed; " + self.exit_report(f"{len(waiting)} command(s) ran")
        for pending in waiting:
            pending._box.put({"rc": -1, "out": "", "err": why})

    def alive(self) -> bool:
        """QEMU is running (started and not exited)."""
        return self.proc is not None and self.proc.poll() is None

    def ensure_alive(self, doing: str) -> None:
        """Raise :class:`VMExited` (with the console's tail) if QEMU has exited; ``doing`` names the step."""
        if self.proc is not None and not self.alive():
            raise VMExited(self.exit_report(doing))

    def exit_report(self, doing: str) -> str:
        rc = self.proc.poll() if self.proc is not None else None
        return (
            f"the lab VM exited (qemu rc={rc}) while {doing}; console:\n{self._tail('console.log')}\n"
            f"qemu:\n{self._tail('qemu.out', 1500)}"
        )

    def _tail(self, name: str, size: int = 4000) -> str:
        try:
            return (self.rundir / name).read_bytes()[-size:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        """Power off (the guest syncs first), then terminate and kill: no QEMU survives this call."""
        proc = self.proc
        if proc is not None and proc.poll() is None and self._sock is not None:
            try:
                self._send({"id": -1, "op": "poweroff"})
                proc.wait(timeout=15)
            except (OSError, LabError, subprocess.TimeoutExpired):
                pass
        self.power_cut()

    def power_cut(self) -> None:
        """QEMU terminated at once: the guest gets no chance to sync (what a pulled plug does)."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def reboot(self, hard: bool = False) -> float:
        """Power-cycle: clean poweroff (or, with ``hard``, pull the plug) and boot again on the same scratch
        disk. Returns the new boot-to-ready seconds."""
        if hard:
            self.power_cut()
        else:
            self.stop()
        self.start()
        return self.boot_seconds

    def close(self) -> None:
        """Stop and remove the run folder (scratch image included) unless LAB_KEEP is set."""
        self.stop()
        if not os.environ.get("LAB_KEEP"):
            shutil.rmtree(self.rundir, ignore_errors=True)

    def __enter__(self) -> LabVM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- commands ----------------------------------------------------------------------------------------
    def _send(self, request: Mapping[str, Any]) -> None:
        if self._sock is None:
            raise LabError("the VM is not running")
        try:
            self._sock.sendall((json.dumps(request) + "\n").encode())
        except OSError as err:  # the guest end is gone: say why, with the console, rather than a broken pipe
            if self.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=5)
            raise VMExited(self.exit_report(f"sending {request.get('op')} ({err})")) from err

    def _request(self, what: str, timeout: float, **request: Any) -> Pending:
        rid = next(self._ids)
        pending = Pending(what, timeout, lambda: f"console:\n{self._tail('console.log')}")
        with self._lock:
            self._pending[rid] = pending
        self._send({"id": rid, "timeout": timeout, **request})
        return pending

    def submit(
        self, argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None, cwd: str = "/", stdin: str = ""
    ) -> Pending:
        """Start ``argv`` in the guest (no shell; ``stdin`` is its whole input) and return at once."""
        what = " ".join(argv)
        return self._request(what, timeout, op="exec", argv=list(argv), env=dict(env or {}), cwd=cwd, input=stdin)

    def run(
        self, argv: Sequence[str], timeout: float = 60, env: Mapping[str, str] | None = None, cwd: str = "/"
    ) -> Result:
        return self.submit(argv, timeout, env, cwd).wait()

    def check(
        self, argv: Sequence[str], timeout: float = 60, env: Mapping[str, str] | None = None, cwd: str = "/"
    ) -> str:
        """Run ``argv``; raise :class:`GuestError` on a non-zero exit; return stdout."""
        return self.submit(argv, timeout, env, cwd).check()

    def sh(self, cmd: str, timeout: float = 60) -> Result:
        """A bash command line in the guest, for tests and diagnostics (product code uses argv)."""
        return self._request(cmd, timeout, op="sh", cmd=cmd).wait()

    def _file(self, op: str, path: str, **extra: Any) -> str:
        return self._request(f"{op} {path}", 30, op=op, path=path, **extra).check()

    def write(self, path: str, data: str) -> None:
        self._file("write", path, data=data)

    def read(self, path: str) -> str:
        return self._file("read", path)

    def mkdir(self, path: str) -> None:
        self._file("mkdir", path)

    def rmdir(self, path: str) -> None:
        self._file("rmdir", path)

    def unlink(self, path: str) -> None:
        self._file("unlink", path)

    def symlink(self, src: str, path: str) -> None:
        self._file("symlink", path, src=src)

    def listdir(self, path: str) -> list[str]:
        out = self._file("listdir", path)
        return out.split("\n") if out else []

    def exists(self, path: str) -> bool:
        return self.run(["test", "-e", path], timeout=10).rc == 0

    # -- facts -------------------------------------------------------------------------------------------
    @property
    def hostnqn(self) -> str:
        return str(self.ready["hostnqn"])

    @property
    def python(self) -> str:
        """The host's (venv) interpreter, which the guest runs through the 9p root share with our code."""
        return sys.executable
