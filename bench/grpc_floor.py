"""The floor of any agent served over gRPC in Python: a server whose Health does nothing, on the same kind of
unix socket and generated stubs as the target agent (the synchronous server, the cheapest grpcio offers).
bench/provision_guest.py times round trips to it next to the agent's.

usage: python bench/grpc_floor.py SOCKET   (serves until killed)
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

from nvmeof_csi.gen import nvmeof_agent_pb2 as pb


def health(request: pb.HealthRequest, context: Any) -> pb.HealthResponse:
    return pb.HealthResponse(ready=True)


def main() -> None:
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                "nvmeof.agent.v1.Agent",
                {
                    "Health": grpc.unary_unary_rpc_method_handler(
                        health,
                        request_deserializer=pb.HealthRequest.FromString,
                        response_serializer=pb.HealthResponse.SerializeToString,
                    ),
                },
            )
        ]
    )
    server.add_insecure_port(f"unix://{sys.argv[1]}")
    server.start()
    server.wait_for_termination()


if __name__ == "__main__":
    main()
