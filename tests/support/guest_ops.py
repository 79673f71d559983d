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
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from google.protobuf.json_format import MessageToDict

from nvmeof_csi.agent.configfs import Nvmet
from nvmeof_csi.agentclient.client import AgentClient, AgentTarget
from nvmeof_csi.rpc.endpoints import Endpoint


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
        if op == "list":
            return [MessageToDict(v, preserving_proto_field_name=True) for v in client.list_volumes()]
        if op == "concurrent":
            calls, names, size = int(args[0]), int(args[1]), int(args[2])
            with ThreadPoolExecutor(calls) as pool:
                uuids = list(pool.map(lambda i: client.create_volume(f"c-{i % names}", size).uuid, range(calls)))
            return {"calls": calls, "distinct_uuids": len(set(uuids)), "volumes": len(client.list_volumes())}
    raise SystemExit(f"unknown op {op}")


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
