"""Agent operations run inside the lab VM in one process (Python start-up under TCG costs seconds, so a
test batches its calls here). usage: python -m tests.support.guest_ops SOCKET OP [ARGS...]; prints JSON.

  create NAME SIZE_BYTES [HOST_NQN]   create (idempotent) and optionally allow a host
  allow UUID HOST_NQN [ro]            allow a host (read-only with ``ro``)
  deny UUID HOST_NQN
  resize UUID SIZE_BYTES
  delete UUID
  concurrent CALLS NAMES SIZE         CALLS concurrent creates over NAMES distinct names
  dump                                the nvmet configfs tree as the agent's model sees it
  list                                the agent's volumes
  replica NAME SIZE UUID SPEC HOST    create this agent's replica (SPEC: the pair as JSON), allow HOST
  get UUID                            the volume as GetVolume shows it (a replica's DRBD state too)
  role UUID ROLE EPOCH [DECISION]     the replica's new role; with DECISION (fenced | refused) every DRBD
                                      fence-peer call waiting meanwhile is answered so, as the controller would;
                                      prints the volume (or the refusal), the calls answered and the seconds
  answer UUID DECISION                answer every fence-peer call of UUID waiting now (fenced | refused)
  ana GROUP STATE [GROUP STATE ...]   SetAnaState of each group in turn (as ``nvmeofctl ana set``)
  attempt snapshot NAME UUID | attempt create NAME SIZE
                                      the call, its refusal returned ({"refused": "Type: reason"}), not raised
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from google.protobuf.json_format import MessageToDict

from nvmeof_csi.agent.configfs import Nvmet
from nvmeof_csi.agentclient.client import AgentClient, AgentTarget
from nvmeof_csi.errors import DriverError
from nvmeof_csi.rpc.endpoints import Endpoint


def role(client: AgentClient, vol: str, to: str, epoch: int, decision: str) -> dict[str, Any]:
    """SetReplicaRole, answering the fence-peer calls it waits for with ``decision`` (none: not answered)."""
    began, answered = time.monotonic(), []
    with ThreadPoolExecutor(1) as pool:
        call = pool.submit(client.set_replica_role, vol, to, epoch, 300)
        while not call.done():
            for request in client.fence_requests() if decision else ():
                if request.volume_uuid == vol and client.answer_fence(vol, request.pid, decision == "fenced"):
                    answered.append(round(time.monotonic() - began, 2))
            time.sleep(0.3)
        try:
            out: dict[str, Any] = {"volume": MessageToDict(call.result(), preserving_proto_field_name=True)}
        except DriverError as err:
            out = {"refused": f"{type(err).__name__}: {err}"}
    return {**out, "answered_at": answered, "seconds": round(time.monotonic() - began, 2)}


def attempt(client: AgentClient, what: str, name: str, arg: str) -> dict[str, Any]:
    """CreateSnapshot (``arg``: the source volume) or CreateVolume (``arg``: the size) of ``name``, a refusal
    returned rather than raised."""
    try:
        made = client.create_snapshot(name, arg) if what == "snapshot" else client.create_volume(name, int(arg))
    except DriverError as err:
        return {"refused": f"{type(err).__name__}: {err}"}
    return {"made": MessageToDict(made, preserving_proto_field_name=True)}


def main(argv: list[str]) -> Any:
    sock, op, args = argv[0], argv[1], argv[2:]
    if op == "dump":
        return Nvmet().dump()
    target = AgentTarget("lab", Endpoint.parse(f"unix://{sock}"))
    with AgentClient(target, 120) as client:
        if op == "create":
            vol = client.create_volume(args[0], int(args[1]))
            if len(args) > 2:
                vol = client.allow_host(vol.uuid, args[2])
            return MessageToDict(vol, preserving_proto_field_name=True)
        if op == "allow":
            vol = client.allow_host(args[0], args[1], readonly=args[2:] == ["ro"])
            return MessageToDict(vol, preserving_proto_field_name=True)
        if op == "deny":
            return MessageToDict(client.deny_host(args[0], args[1]), preserving_proto_field_name=True)
        if op == "resize":
            return MessageToDict(client.resize_volume(args[0], int(args[1])), preserving_proto_field_name=True)
        if op == "delete":
            client.delete_volume(args[0])
            return {"deleted": args[0]}
        if op == "replica":
            client.create_volume(args[0], int(args[1]), vol_uuid=args[2], replica=json.loads(args[3]))
            return MessageToDict(client.allow_host(args[2], args[4]), preserving_proto_field_name=True)
        if op == "get":
            return MessageToDict(client.get_volume(args[0]), preserving_proto_field_name=True)
        if op == "answer":
            waiting = [r for r in client.fence_requests() if r.volume_uuid == args[0]]
            return {"answered": sum(client.answer_fence(args[0], r.pid, args[1] == "fenced") for r in waiting)}
        if op == "role":
            return role(client, args[0], args[1], int(args[2]), args[3] if len(args) > 3 else "")
        if op == "list":
            return [MessageToDict(v, preserving_proto_field_name=True) for v in client.list_volumes()]
        if op == "ana":
            pairs = zip(args[::2], args[1::2], strict=True)
            return {group: [p.ana_state for p in client.set_ana(group, state)] for group, state in pairs}
        if op == "attempt":
            return attempt(client, args[0], args[1], args[2])
        if op == "concurrent":
            calls, names, size = int(args[0]), int(args[1]), int(args[2])
            with ThreadPoolExecutor(calls) as pool:
                uuids = list(pool.map(lambda i: client.create_volume(f"c-{i % names}", size).uuid, range(calls)))
            return {"calls": calls, "distinct_uuids": len(set(uuids)), "volumes": len(client.list_volumes())}
    raise SystemExit(f"unknown op {op}")


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
