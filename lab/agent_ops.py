"""Agent operations run inside the lab VM (several in one call). usage: python -m lab.agent_ops SOCKET OP
[ARGS...]; prints JSON. The resident server (``python -m lab.csi_serve agent``) serves the same calls without a
Python start each (seconds under TCG).

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
  unsnap UUID                         delete a snapshot
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

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


def as_dict(msg: Message) -> dict[str, Any]:
    return MessageToDict(msg, preserving_proto_field_name=True)


def create(client: AgentClient, name: str, size: str, *host: str) -> dict[str, Any]:
    vol = client.create_volume(name, int(size))
    return as_dict(client.allow_host(vol.uuid, host[0]) if host else vol)


def replica(client: AgentClient, name: str, size: str, vol: str, spec: str, host: str) -> dict[str, Any]:
    client.create_volume(name, int(size), vol_uuid=vol, replica=json.loads(spec))
    return as_dict(client.allow_host(vol, host))


def answer(client: AgentClient, vol: str, decision: str) -> dict[str, Any]:
    waiting = [r for r in client.fence_requests() if r.volume_uuid == vol]
    return {"answered": sum(client.answer_fence(vol, r.pid, decision == "fenced") for r in waiting)}


def ana(client: AgentClient, *args: str) -> dict[str, Any]:
    pairs = zip(args[::2], args[1::2], strict=True)
    return {group: [p.ana_state for p in client.set_ana(group, state)] for group, state in pairs}


def concurrent(client: AgentClient, calls: str, names: str, size: str) -> dict[str, Any]:
    n, k = int(calls), int(names)
    with ThreadPoolExecutor(n) as pool:
        uuids = list(pool.map(lambda i: client.create_volume(f"c-{i % k}", int(size)).uuid, range(n)))
    return {"calls": n, "distinct_uuids": len(set(uuids)), "volumes": len(client.list_volumes())}


def deleted(call: Callable[[str], object], uuid: str) -> dict[str, Any]:
    call(uuid)
    return {"deleted": uuid}


def calls(client: AgentClient) -> dict[str, Callable[..., Any]]:
    """Each call by name: its arguments are the command line's, as strings."""
    return {
        "create": partial(create, client),
        "allow": lambda vol, host, *ro: as_dict(client.allow_host(vol, host, readonly=list(ro) == ["ro"])),
        "deny": lambda vol, host: as_dict(client.deny_host(vol, host)),
        "resize": lambda vol, size: as_dict(client.resize_volume(vol, int(size))),
        "delete": lambda vol: deleted(client.delete_volume, vol),
        "replica": partial(replica, client),
        "get": lambda vol: as_dict(client.get_volume(vol)),
        "answer": partial(answer, client),
        "role": lambda vol, to, epoch, *decision: role(client, vol, to, int(epoch), "".join(decision)),
        "list": lambda: [as_dict(v) for v in client.list_volumes()],
        "ana": partial(ana, client),
        "attempt": partial(attempt, client),
        "unsnap": lambda snap: deleted(client.delete_snapshot, snap),
        "concurrent": partial(concurrent, client),
    }


def main(argv: list[str]) -> Any:
    sock, op, args = argv[0], argv[1], argv[2:]
    if op == "dump":
        return Nvmet().dump()
    target = AgentTarget("lab", Endpoint.parse(f"unix://{sock}"))
    with AgentClient(target, 120) as client:
        call = calls(client).get(op)
        if call is None:
            raise SystemExit(f"unknown op {op}")
        return call(*args)


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
