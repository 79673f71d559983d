"""The baselines bench/provision_guest.py times the target agent against: the same configfs writes and file
operations as a script, with no agent, no gRPC, no logging.

- ``raw_*`` (``durable=False``): what a quick script does, only the image fsynced.
- ``raw_*`` (``durable=True``): the image and a per-volume record written atomically and durably, deletions
  made durable: the durability the agent promises, the fewest steps that give it.
- ``contract_*``: every system call the agent makes for a volume without hosts, in its order: the record saved
  ``creating`` before anything is made, the image through a temp file, the subsystem with its identity
  attributes, the namespace with all of its, the host grants listed, the port links, then the record renamed
  ``ready``; on delete the record renamed ``deleting`` first (a folder flush), the links, namespace and
  subsystem removed, the image removed durably, the record unlinked (neither the rename to ``ready`` nor the
  final unlink is flushed: ``nvmeof_csi/agent/state.py`` says why losing them is harmless). The agent's own
  floor for its contract, with the cost of doing it from Python and nothing else.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from nvmeof_csi.host.atomic import fsync_dir, remove_durably, write_atomic, write_json_atomic
from nvmeof_csi.nvmeof.nqn import namespace_nguid

CFS = Path("/sys/kernel/config/nvmet")
SIZE = 64 << 20


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def raw_create(pool: Path, ports: list[str], durable: bool = False) -> str:
    vol = str(uuid.uuid4())
    image = pool / f"raw-{vol}.img"
    if durable:  # the record first (a crash leaves no unknown file), then the image
        write_json_atomic(pool / "records" / f"{vol}.json", {"uuid": vol, "size": SIZE})
    with open(image, "wb") as f:
        os.ftruncate(f.fileno(), SIZE)
        os.fsync(f.fileno())
    if durable:
        fsync_dir(pool)
    sub = CFS / "subsystems" / f"nqn.2026-11.io.nvmeof:raw:{vol}"
    sub.mkdir()
    _write(sub / "attr_allow_any_host", "0")
    ns = sub / "namespaces" / "1"
    ns.mkdir()
    _write(ns / "device_path", str(image))
    _write(ns / "device_uuid", vol)
    _write(ns / "enable", "1")
    for port in ports:
        (CFS / "ports" / port / "subsystems" / sub.name).symlink_to(sub)
    return vol


def raw_delete(pool: Path, ports: list[str], vol: str, durable: bool = False) -> None:
    sub = CFS / "subsystems" / f"nqn.2026-11.io.nvmeof:raw:{vol}"
    for port in ports:
        (CFS / "ports" / port / "subsystems" / sub.name).unlink()
    _write(sub / "namespaces" / "1" / "enable", "0")
    (sub / "namespaces" / "1").rmdir()
    sub.rmdir()
    if durable:
        remove_durably(pool / f"raw-{vol}.img")
        remove_durably(pool / "records" / f"{vol}.json")
    else:
        (pool / f"raw-{vol}.img").unlink()


def contract_create(pool: Path, ports: list[str]) -> str:
    vol = str(uuid.uuid4())
    records = pool / "records"
    write_atomic(records / f"{vol}.creating.json", f'{{"uuid": "{vol}", "size": {SIZE}}}\n'.encode())
    image, tmp = pool / f"c-{vol}.img", pool / f"c-{vol}.tmp"
    with open(tmp, "wb") as f:
        os.ftruncate(f.fileno(), SIZE)
        os.fsync(f.fileno())
    os.replace(tmp, image)
    fsync_dir(pool)
    sub = CFS / "subsystems" / f"nqn.2026-11.io.nvmeof:c:{vol}"
    sub.mkdir()
    for attr, value in (
        ("attr_allow_any_host", "0"),
        ("attr_serial", vol.replace("-", "")[:20]),
        ("attr_model", "nvmeof-csi"),
    ):
        _write(sub / attr, value)
    ns = sub / "namespaces" / "1"
    ns.mkdir()
    for attr, value in (
        ("device_path", str(image)),
        ("device_uuid", vol),
        ("device_nguid", namespace_nguid(vol)),
        ("buffered_io", "0"),
        ("ana_grpid", "1"),
        ("enable", "1"),
    ):
        _write(ns / attr, value)
    os.listdir(sub / "allowed_hosts")
    for port in ports:
        (CFS / "ports" / port / "subsystems" / sub.name).symlink_to(sub)
    os.replace(records / f"{vol}.creating.json", records / f"{vol}.json")  # not flushed: see agent.state
    return vol


def contract_delete(pool: Path, ports: list[str], vol: str) -> None:
    records = pool / "records"
    os.replace(records / f"{vol}.json", records / f"{vol}.deleting.json")
    fsync_dir(records)
    sub = CFS / "subsystems" / f"nqn.2026-11.io.nvmeof:c:{vol}"
    for port in ports:
        (CFS / "ports" / port / "subsystems" / sub.name).unlink()
    os.listdir(sub / "allowed_hosts")
    _write(sub / "namespaces" / "1" / "enable", "0")
    (sub / "namespaces" / "1").rmdir()
    sub.rmdir()
    remove_durably(pool / f"c-{vol}.img")
    (records / f"{vol}.deleting.json").unlink()
