"""bench/profile.py: each sampled stack lands in exactly one category, the first rule any of its frames matches."""

from __future__ import annotations

from bench.profile import OTHER, RULES, categorise, leaves

_GRPC = (
    "thread (7): rpc_1;Thread.run (threading.py:982);_worker (concurrent/futures/thread.py:81);"
    "_unary_response_in_pool (grpc/_server.py:796)"
)
_CALL = _GRPC + ";call (nvmeof_csi/rpc/edge.py:202);AgentServicer.CreateVolume (nvmeof_csi/agent/api.py:137)"
RAW = "\n".join(
    [
        f"{_GRPC};_status (grpc/_server.py:766) 10",
        f"{_CALL};StateStore._save (nvmeof_csi/agent/state.py:252);write_atomic (nvmeof_csi/host/atomic.py:30) 6",
        f"{_CALL};Nvmet.ensure_namespace (nvmeof_csi/agent/configfs.py:90);"
        "ConfigfsTree._put (nvmeof_csi/agent/configfs_tree.py:55);PurePath.__truediv__ (pathlib.py:765) 4",
        f"{_CALL};FileStore.create (nvmeof_csi/agent/pool.py:60) 3",
        "thread (7): rpc_1;TextWriter.write (protobuf/text_format.py:109) 2",  # a stack py-spy cut short
        f"{_GRPC};call (nvmeof_csi/rpc/edge.py:199);Logger.info (logging/__init__.py:1479) 2",
        f"{_GRPC};call (nvmeof_csi/rpc/edge.py:197);Authorizer.__call__ (nvmeof_csi/agent/authz.py:120) 1",
        f"{_GRPC};call (nvmeof_csi/rpc/edge.py:197) 1",
        f"{_CALL};_name (nvmeof_csi/agent/api.py:60) 2",
        "thread (9): main;sleep (time.py:1) 1",
        f"{_GRPC.rsplit(';', 1)[0]} 40",  # a pool worker waiting on its queue: not counted
        "thread (8): Thread.run (threading.py:982);Condition.wait (threading.py:320) 7",
        "",
        "garbage line without a count",
    ]
)


def test_each_stack_is_counted_once_in_the_first_matching_category() -> None:
    shares, pathlib, samples = categorise(RAW)
    assert samples == 32
    counts = {k: round(v * samples) for k, v in shares.items()}
    assert counts == {
        "log lines": 4,
        "state records": 6,
        "configfs": 4,
        "pool image files": 3,
        "authorization": 1,
        "agent logic": 2,
        "edge": 1,
        "gRPC and threads": 10,
        OTHER: 1,
    }
    assert pathlib == round(4 / 32, 4)
    assert set(shares) == {name for name, _ in RULES} | {OTHER}


def test_an_empty_profile_has_every_category_at_zero() -> None:
    shares, pathlib, samples = categorise("")
    assert samples == 0 and pathlib == 0.0 and set(shares.values()) == {0.0}


def test_leaves_rank_the_innermost_frames_without_their_lines() -> None:
    top = leaves(RAW, 2)
    assert top == [
        ("_status (grpc/_server.py)", round(10 / 32, 4)),
        ("write_atomic (nvmeof_csi/host/atomic.py)", round(6 / 32, 4)),
    ]


def test_the_scale_bench_gives_each_parts_cpu_added_between_the_fewest_and_the_most_volumes() -> None:
    from bench.scale_agent import profile_growth

    base = {"profile": {"cpu_ms_by_part": {"configfs": 2.0, "state records": 3.0}}}
    top = {"profile": {"cpu_ms_by_part": {"configfs": 5.5, "state records": 2.75}}}
    assert profile_growth(base, top) == {"cpu_ms_growth_by_part": {"configfs": 3.5, "state records": -0.25}}
    assert profile_growth({}, top) == {}  # no profile at one end: nothing to say
