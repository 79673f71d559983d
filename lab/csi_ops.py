"""CSI calls against our driver, run *inside* the lab VM in one process per batch (Python start-up under TCG
costs seconds, so a test or the demo sends several steps at once).

usage: python -m lab.csi_ops SOCKET STEPS_JSON
    STEPS_JSON is a JSON list of steps, each ``{"op": OP, "name": VOLUME_NAME, ...}``; prints one JSON list
    with each step's result (and ``seconds``, the time the step took) on its last output line.

Ops (what the kubelet / external-provisioner / external-attacher would call, in that order):
  create  size, mode (mount|block), fs (ext4|xfs), params   CreateVolume, accessible from this node
  attach  [secrets, node]                                    ControllerPublishVolume to this node (or ``node``)
  stage [secrets] / publish / unpublish / unstage            the Node RPCs on the paths in the ledger (publish and
                                                             unpublish take another ``target`` path too, publish
                                                             and up a ``pod`` UID as kubelet sends it); secrets
                                                             are the CSI secrets of the call (never stored)
  access  mode                                               use this CSI access mode (e.g. MULTI_NODE_READER_ONLY)
  modify  params                                             ControllerModifyVolume (mutable parameters: I/O limits)
  detach [node, reason] / delete                             ControllerUnpublishVolume (of this node, or of
                                                             ``node`` with a CSI 1.14 ``reason`` name) /
                                                             DeleteVolume
  up / down                                                  create+attach+stage+publish / the reverse (up takes
                                                             ``secrets`` for attach and stage)
  stats                                                      NodeGetVolumeStats (usage)
  health                                                     NodeGetVolumeHealth + ControllerGetVolumeHealth
  expand  size                                               ControllerExpandVolume, then NodeExpandVolume
  probe-target  mib                                          a preallocated file (mount) or the device (block)
                                                             for the I/O probe
  write-dataset  files, kib                                  random files + a sha256 manifest (kept in the ledger)
  verify-dataset                                             drop the page cache, re-read, compare the manifest

Contract: a volume's IDs and contexts live in a small ledger file (``LEDGER``) so that later batches, even
after the driver was killed and restarted, address the same volume with the same paths. Any RPC error ends
the batch with a non-zero exit and the gRPC code and message on stderr.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from lab.guest_files import verify_dataset, write_dataset, write_probe_file
from nvmeof_csi.gen import csi_pb2, csi_pb2_grpc

LEDGER = Path("/run/nvmeof-csi/lab/ledger.json")
WORK = Path("/run/nvmeof-csi/lab/volumes")
TIMEOUT = 300.0
POD_UID = "csi.storage.k8s.io/pod.uid"
Step = dict[str, Any]
#: the ops a batch may name (``probe_target`` as ``probe-target`` and so on)
# fmt: off
OPS = (
    "create", "attach", "stage", "publish", "unpublish", "unstage", "detach", "delete", "up", "down", "stats",
    "health", "expand", "probe_target", "write_dataset", "verify_dataset", "access", "modify",
)
# fmt: on


class Csi:
    def __init__(self, socket: str) -> None:
        channel = grpc.insecure_channel(f"unix://{socket}")
        self.controller = csi_pb2_grpc.ControllerStub(channel)
        self.node = csi_pb2_grpc.NodeStub(channel)
        self.ledger: dict[str, Step] = json.loads(LEDGER.read_text()) if LEDGER.exists() else {}
        self._info: csi_pb2.NodeGetInfoResponse | None = None

    def save(self) -> None:
        LEDGER.parent.mkdir(parents=True, exist_ok=True)
        tmp = LEDGER.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.ledger, indent=1))
        os.replace(tmp, LEDGER)

    def info(self) -> csi_pb2.NodeGetInfoResponse:
        if self._info is None:
            self._info = self.node.NodeGetInfo(csi_pb2.NodeGetInfoRequest(), timeout=TIMEOUT)
        return self._info

    @staticmethod
    def capability(vol: Step) -> csi_pb2.VolumeCapability:
        mode = str(vol.get("access", "SINGLE_NODE_WRITER"))  # an AccessMode name
        cap = csi_pb2.VolumeCapability(access_mode=csi_pb2.VolumeCapability.AccessMode(mode=mode))
        if vol["mode"] == "block":
            cap.block.SetInParent()
        else:
            cap.mount.fs_type = vol["fs"]
        return cap

    # -- ops -------------------------------------------------------------------------------------------------
    def create(
        self, name: str, size: int, mode: str = "mount", fs: str = "ext4", params: dict[str, str] | None = None
    ) -> Step:
        vol: Step = {"mode": mode, "fs": fs}
        topo = csi_pb2.Topology(segments=self.info().accessible_topology.segments)
        reply = self.controller.CreateVolume(
            csi_pb2.CreateVolumeRequest(
                name=name,
                capacity_range=csi_pb2.CapacityRange(required_bytes=size),
                volume_capabilities=[self.capability(vol)],
                parameters=params or {},
                accessibility_requirements=csi_pb2.TopologyRequirement(requisite=[topo], preferred=[topo]),
            ),
            timeout=TIMEOUT,
        )
        base = WORK / name
        vol.update(
            volume_id=reply.volume.volume_id,
            context=dict(reply.volume.volume_context),
            capacity=reply.volume.capacity_bytes,
            staging=str(base / "staging"),
            target=str(base / ("device" if mode == "block" else "mount")),
        )
        self.ledger[name] = vol
        self.save()
        return {
            "volume_id": vol["volume_id"],
            "capacity": vol["capacity"],
            "nqn": vol["context"].get("nqn"),
            "portals": vol["context"].get("portals"),
        }

    def attach(self, name: str, secrets: dict[str, str] | None = None, node: str = "") -> Step:
        vol = self.ledger[name]
        reply = self.controller.ControllerPublishVolume(
            csi_pb2.ControllerPublishVolumeRequest(
                volume_id=vol["volume_id"],
                node_id=node or self.info().node_id,
                volume_capability=self.capability(vol),
                volume_context=vol["context"],
                secrets=secrets or {},
            ),
            timeout=TIMEOUT,
        )
        if node:  # published to another node: this node's ledger keeps its own
            return {"publish_context": dict(reply.publish_context)}
        vol["publish_context"] = dict(reply.publish_context)
        self.save()
        return {"publish_context": vol["publish_context"]}

    def stage(self, name: str, secrets: dict[str, str] | None = None) -> Step:
        vol = self.ledger[name]
        Path(vol["staging"]).mkdir(parents=True, exist_ok=True)
        self.node.NodeStageVolume(
            csi_pb2.NodeStageVolumeRequest(
                volume_id=vol["volume_id"],
                staging_target_path=vol["staging"],
                volume_capability=self.capability(vol),
                publish_context=vol.get("publish_context", {}),
                volume_context=vol["context"],
                secrets=secrets or {},
            ),
            timeout=TIMEOUT,
        )
        return {}

    def publish(self, name: str, target: str = "", pod: str = "") -> Step:
        vol = self.ledger[name]
        path = target or vol["target"]
        context = {**vol["context"], **({POD_UID: pod} if pod else {})}  # what kubelet adds (podInfoOnMount)
        self.node.NodePublishVolume(
            csi_pb2.NodePublishVolumeRequest(
                volume_id=vol["volume_id"],
                staging_target_path=vol["staging"],
                target_path=path,
                volume_capability=self.capability(vol),
                publish_context=vol.get("publish_context", {}),
                volume_context=context,
            ),
            timeout=TIMEOUT,
        )
        return {"target": path}

    def unpublish(self, name: str, target: str = "") -> Step:
        vol = self.ledger[name]
        self.node.NodeUnpublishVolume(
            csi_pb2.NodeUnpublishVolumeRequest(volume_id=vol["volume_id"], target_path=target or vol["target"]),
            timeout=TIMEOUT,
        )
        return {}

    def modify(self, name: str, params: dict[str, str]) -> Step:
        """ControllerModifyVolume with ``params`` as the mutable parameters (a VolumeAttributesClass change)."""
        vol = self.ledger[name]
        self.controller.ControllerModifyVolume(
            csi_pb2.ControllerModifyVolumeRequest(volume_id=vol["volume_id"], mutable_parameters=params),
            timeout=TIMEOUT,
        )
        return {"modified_at": time.time()}

    def access(self, name: str, mode: str) -> Step:
        """Use access mode ``mode`` (a CSI AccessMode name) in this volume's later calls."""
        self.ledger[name]["access"] = mode
        self.save()
        return {"access": mode}

    def unstage(self, name: str) -> Step:
        vol = self.ledger[name]
        self.node.NodeUnstageVolume(
            csi_pb2.NodeUnstageVolumeRequest(volume_id=vol["volume_id"], staging_target_path=vol["staging"]),
            timeout=TIMEOUT,
        )
        return {}

    def detach(self, name: str, node: str = "", reason: str = "") -> Step:
        vol = self.ledger[name]
        self.controller.ControllerUnpublishVolume(
            csi_pb2.ControllerUnpublishVolumeRequest(
                volume_id=vol["volume_id"],
                node_id=node or self.info().node_id,
                reason=reason or "UNKNOWN",
            ),
            timeout=TIMEOUT,
        )
        return {}

    def delete(self, name: str) -> Step:
        vol = self.ledger.pop(name)
        self.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=vol["volume_id"]), timeout=TIMEOUT)
        self.save()
        return {}

    def up(self, name: str, secrets: dict[str, str] | None = None, pod: str = "", **create: Any) -> Step:
        result = self.create(name, **create)
        result.update(self.attach(name, secrets))
        result.update(self.stage(name, secrets))
        result.update(self.publish(name, pod=pod))
        return result

    def down(self, name: str) -> Step:
        for op in (self.unpublish, self.unstage, self.detach, self.delete):
            op(name)
        return {}

    def stats(self, name: str) -> Step:
        vol = self.ledger[name]
        reply = self.node.NodeGetVolumeStats(
            csi_pb2.NodeGetVolumeStatsRequest(
                volume_id=vol["volume_id"], volume_path=vol["target"], staging_target_path=vol["staging"]
            ),
            timeout=TIMEOUT,
        )
        usage = {csi_pb2.VolumeUsage.Unit.Name(u.unit): {"total": u.total, "used": u.used} for u in reply.usage}
        return {"usage": usage}

    def health(self, name: str) -> Step:
        """NodeGetVolumeHealth and ControllerGetVolumeHealth: [status, reason, message] entries of each."""
        vol = self.ledger[name]
        node = self.node.NodeGetVolumeHealth(
            csi_pb2.NodeGetVolumeHealthRequest(
                volume_id=vol["volume_id"], volume_publish_path=vol["target"], staging_target_path=vol["staging"]
            ),
            timeout=TIMEOUT,
        ).volume_health
        ctl = self.controller.ControllerGetVolumeHealth(
            csi_pb2.ControllerGetVolumeHealthRequest(volume_id=vol["volume_id"]), timeout=TIMEOUT
        ).volume_health

        def entries(health: csi_pb2.VolumeHealth) -> list[list[str]]:
            return [[csi_pb2.VolumeHealthErrorType.Name(e.status), e.reason, e.message] for e in health.health_statuses]

        return {"node": entries(node), "controller": entries(ctl)}

    def expand(self, name: str, size: int) -> Step:
        vol = self.ledger[name]
        rng = csi_pb2.CapacityRange(required_bytes=size)
        ctrl = self.controller.ControllerExpandVolume(
            csi_pb2.ControllerExpandVolumeRequest(
                volume_id=vol["volume_id"], capacity_range=rng, volume_capability=self.capability(vol)
            ),
            timeout=TIMEOUT,
        )
        node_bytes = 0
        if ctrl.node_expansion_required:
            node_bytes = self.node.NodeExpandVolume(
                csi_pb2.NodeExpandVolumeRequest(
                    volume_id=vol["volume_id"],
                    volume_path=vol["target"],
                    staging_target_path=vol["staging"],
                    capacity_range=rng,
                    volume_capability=self.capability(vol),
                ),
                timeout=TIMEOUT,
            ).capacity_bytes
        vol["capacity"] = ctrl.capacity_bytes
        self.save()
        fs_bytes = 0
        if vol["mode"] == "mount":
            st = os.statvfs(vol["target"])
            fs_bytes = st.f_blocks * st.f_frsize
        return {"controller_bytes": ctrl.capacity_bytes, "node_bytes": node_bytes, "filesystem_bytes": fs_bytes}

    def probe_target(self, name: str, mib: int = 16) -> Step:
        vol = self.ledger[name]
        if vol["mode"] == "block":
            return {"path": vol["target"]}
        return {"path": str(write_probe_file(Path(vol["target"]), mib))}

    def write_dataset(self, name: str, files: int = 64, kib: int = 512) -> Step:
        vol = self.ledger[name]
        vol["manifest"] = write_dataset(Path(vol["target"]) / "dataset", files, kib)
        self.save()
        return {"files": files, "bytes": files * (kib << 10)}

    def verify_dataset(self, name: str) -> Step:
        vol = self.ledger[name]
        return verify_dataset(Path(vol["target"]) / "dataset", vol["manifest"])


def run(socket: str, steps: list[Step]) -> list[Step]:
    csi = Csi(socket)
    ops: dict[str, Callable[..., Step]] = {name.replace("_", "-"): getattr(csi, name) for name in OPS}
    results = []
    for step in steps:
        args = dict(step)
        op = ops[args.pop("op")]
        begin = time.monotonic()
        result = op(**args)
        results.append(
            {"op": step["op"], "name": step.get("name"), **result, "seconds": round(time.monotonic() - begin, 3)}
        )
    return results


def main(argv: list[str]) -> int:
    try:
        results = run(argv[0], json.loads(argv[1]))
    except grpc.RpcError as err:
        print(f"csi_ops: {err.code().name}: {err.details()}", file=sys.stderr)
        return 1
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
