"""One storage node's side of a DRBD pair for the replication proofs (runs in the guest with the host's venv
Python, so it drives the agent's own code: ``agent/drbd.py``, ``agent/fence_spool.py``).

usage: python drbd_side.py prepare SPOOL [--default-helper] [--disk VOL MIB]
       python drbd_side.py disk VOL MIB
       python drbd_side.py up VOL SECRET MINOR RESOURCE_FILE
       python drbd_side.py step VOL SECRET {skip_initial_sync,promote,demote}
       python drbd_side.py answer SPOOL CODE
       python drbd_side.py down VOL SECRET MINOR

``prepare`` loads DRBD with the agent's helper (the spool's ``sh`` script) as the module's usermode helper, or
with the module's default (``/sbin/drbdadm``) under ``--default-helper``: what the proofs' failing run uses;
with ``--disk`` it makes the backing device too, as ``disk`` does.
``disk`` makes a backing loop device of MIB in ``/run`` and prints it; ``up`` brings the resource of
RESOURCE_FILE (its text, made on the host by ``agent/drbd_config.py`` with both sides' disks) up: metadata, attach,
connect. ``answer`` answers every pending fence-peer call with CODE and prints how many. Each prints one JSON line;
a failing step exits non-zero with its error.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from nvmeof_csi.agent.drbd import DrbdResources
from nvmeof_csi.agent.fence_spool import HELPER_NAME, FenceSpool, helper_script
from nvmeof_csi.host.executor import SubprocessExecutor

CONF = Path("/run/nvmeof-drbd/conf")


def resources() -> DrbdResources:
    return DrbdResources(SubprocessExecutor(), CONF)


def prepare(spool: Path, default_helper: bool) -> dict[str, object]:
    Path("/run/lock").mkdir(exist_ok=True)  # drbdmeta locks a minor in /var/lock (-> /run/lock: a fresh tmpfs here)
    spool.mkdir(mode=0o700, parents=True, exist_ok=True)
    helper = spool.parent / HELPER_NAME
    helper.write_text(helper_script(str(spool)))
    helper.chmod(0o755)
    params = [] if default_helper else [f"usermode_helper={helper}"]
    subprocess.run(["modprobe", "drbd", *params], check=True, timeout=60)
    used = Path("/sys/module/drbd/parameters/usermode_helper").read_text().strip()
    return {"usermode_helper": used}


def disk(vol: str, mib: int) -> dict[str, object]:
    image = Path(f"/run/nvmeof-drbd/{vol}.img")
    image.parent.mkdir(parents=True, exist_ok=True)
    with image.open("wb") as f:
        f.truncate(mib << 20)
    subprocess.run(["modprobe", "loop"], check=True, timeout=60)
    loop = subprocess.run(["losetup", "--find", "--show", str(image)], capture_output=True, text=True, check=False)
    if loop.returncode != 0:
        raise SystemExit(f"losetup: {loop.stderr.strip()}")
    return {"disk": loop.stdout.strip()}


def up(vol: str, secret: str, minor: int, text_file: Path) -> dict[str, object]:
    drbd = resources()
    drbd.write(vol, text_file.read_text())
    drbd.create_metadata(vol, secret)
    drbd.up(vol, secret, minor)
    return {"up": vol}


def main(argv: list[str]) -> int:
    what, args = argv[0], argv[1:]
    if what == "prepare":
        out = prepare(Path(args[0]), "--default-helper" in args)
        if "--disk" in args:
            at = args.index("--disk")
            out |= disk(args[at + 1], int(args[at + 2]))
    elif what == "disk":
        out = disk(args[0], int(args[1]))
    elif what == "up":
        out = up(args[0], args[1], int(args[2]), Path(args[3]))
    elif what == "step":
        getattr(resources(), args[2])(args[0], args[1])
        out = {"done": args[2]}
    elif what == "answer":
        code = int(args[1])
        out = {"answered": FenceSpool(Path(args[0]), lambda request: code).answer_pending()}
    elif what == "down":
        resources().down(args[0], args[1], int(args[2]))
        out = {"down": args[0]}
    else:
        print(f"unknown step {what!r}", file=sys.stderr)
        return 2
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
