"""Fencing between machines: the node that is dangerous is not the dead one but one that still reaches the storage
while the control plane has given up on it: cut off from the management network and still writing, or frozen for
less than its keep-alive timeout with writes in flight and dirty pages. In both, ControllerUnpublishVolume with a
CSI 1.14 reason fences it (issued by the controller on ``gpu-2``, as a CO's controller would), ``gpu-2`` then
writes its own tagged pattern over the whole volume, ``gpu-1`` keeps trying (at least twice its keep-alive
timeout plus its reconnect attempts), and the backing file on ``storage-1`` must hold ``gpu-2``'s blocks only.
The partitioned node shares its volume with the other node, which keeps writing through the fence.

Without fencing (``LAB_FENCE_ON=none pytest tests/cluster -m lab -k fenc``) the same tests fail: ``gpu-1``'s
controllers stay live after a plain unpublish, and its blocks land over ``gpu-2``'s."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from lab import IoProbe
from lab.build import LAB_DIR
from lab.cluster_driver import STORAGE, ClusterDriver
from lab.vm import LabVM
from tests.cluster.driving import OFF, WORK, csi, on, uuid_of

pytestmark = pytest.mark.lab
Reporter = Callable[[str, str], None]
SCRIBBLE = str(LAB_DIR / "guest" / "scribble.py")
MARKER = "/tmp/fenced"  # made on gpu-1 once the fence has returned
MiB = 1 << 20
RECONNECT, LOSS = 2, 16


def scribble(vm: LabVM, *args: str, timeout: float = 300) -> dict[str, int]:
    out = vm.check([vm.python, SCRIBBLE, *args], timeout=timeout)
    result: dict[str, int] = json.loads(out.strip().splitlines()[-1])
    return result


def landed(stack: ClusterDriver, volume_id: str) -> dict[str, int]:
    """How many blocks of the volume's backing file each GPU node wrote last."""
    path = stack.agent.ctl("volumes", "show", uuid_of(volume_id))[0]["backing_file"]
    vm = stack.cluster.vm(STORAGE)
    return {node: scribble(vm, "count", path, node)["tagged"] for node in ("gpu-1", "gpu-2")} | {
        "blocks": scribble(vm, "count", path, "gpu-2")["blocks"]
    }


def take_over(stack: ClusterDriver, name: str, params: dict[str, str], node1: str, reason: str) -> None:
    """What the CO does when it gives up on gpu-1: unpublish it with ``reason``, then publish and stage on gpu-2,
    which writes its pattern over every block."""
    create = {"size": 32 * MiB, "mode": "block", "params": params}
    csi(stack, "gpu-2", *on(name, "create", **create), *on(name, "detach", node=node1, reason=reason))


def move_to_gpu2(stack: ClusterDriver, name: str) -> dict[str, int]:
    csi(stack, "gpu-2", *on(name, "attach", "stage", "publish"))
    return scribble(stack.cluster.vm("gpu-2"), "fill", f"{WORK}/{name}/device", "gpu-2")


def start_on_gpu1(
    stack: ClusterDriver, name: str, params: dict[str, str], seconds: float, after: float
) -> tuple[str, str, Any]:
    """The volume on gpu-1 and a writer on it for at most ``seconds``, and ``after`` seconds once the test's
    marker says the fence has returned (gpu-1's reconnect attempts fall in them); (volume ID, gpu-1's node ID,
    the pending writer)."""
    made = csi(stack, "gpu-1", *on(name, "create", "attach", "stage", "publish", size=32 * MiB, mode="block",
                                   params=params))  # fmt: skip
    vm = stack.cluster.vm("gpu-1")
    vm.run(["rm", "-f", MARKER])
    writer = vm.submit([vm.python, SCRIBBLE, "write", f"{WORK}/{name}/device", str(seconds), "gpu-1", "--marker",
                        MARKER, "--after", str(after)], timeout=seconds + 300)  # fmt: skip
    return made[0]["volume_id"], made[1]["publish_context"]["hostNqn"], writer


def clean_up(stack: ClusterDriver, name: str) -> None:
    csi(stack, "gpu-1", *on(name, "unpublish", "unstage"))
    csi(stack, "gpu-2", *on(name, *OFF, "delete"))


def test_a_node_cut_off_from_the_control_plane_but_still_writing_is_fenced_and_none_of_its_writes_land(
    stack: ClusterDriver, report: Reporter
) -> None:
    """A MULTI_NODE_MULTI_WRITER volume on both GPU nodes (the live-migration pattern). gpu-1 loses the control
    plane but keeps its fabric links and keeps writing; ControllerUnpublishVolume of gpu-1 with
    NODE_CLEANUP_TIMEOUT fences it, which cycles the subsystem's port links one at a time and so resets gpu-2's
    paths too: gpu-2's verified I/O goes on with 0 errors (its stall reported), then gpu-2 writes its pattern
    over every block, while gpu-1 keeps trying for longer than its keep-alive and reconnects; none of gpu-1's
    blocks land."""
    kato = 5
    params = {"keepAliveTmo": str(kato), "ctrlLossTmo": str(LOSS), "reconnectDelay": str(RECONNECT)}
    create = on("partitioned", "create", size=64 * MiB, mode="block", params=params)
    shared = [*on("partitioned", "access", mode="MULTI_NODE_MULTI_WRITER"),
              *on("partitioned", "attach", "stage", "publish")]  # fmt: skip
    made = csi(stack, "gpu-1", *create, *shared)
    node1, volume_id = made[2]["publish_context"]["hostNqn"], made[0]["volume_id"]
    csi(stack, "gpu-2", *create, *shared)
    device, gpu1, gpu2 = f"{WORK}/partitioned/device", stack.cluster.vm("gpu-1"), stack.cluster.vm("gpu-2")
    gpu1.run(["rm", "-f", MARKER])
    writer = gpu1.submit([gpu1.python, SCRIBBLE, "write", device, str(40 + 2 * kato + LOSS), "gpu-1", "--marker",
                          MARKER, "--after", str(2 * kato + LOSS + 4), "--first", "8192"],
                         timeout=360 + LOSS)  # fmt: skip
    probe = IoProbe(gpu2, device, seconds=30)  # blocks 0..4095: gpu-1 writes from block 8192 on
    time.sleep(4)
    stack.cluster.cut_management("gpu-1")  # the control plane loses gpu-1; its fabric links stay up
    try:
        csi(stack, "gpu-2", *on("partitioned", "detach", node=node1, reason="NODE_CLEANUP_TIMEOUT"))
        gpu1.write(MARKER, "")
        fenced_at = time.monotonic()
        result = probe.stop()  # once gpu-2's I/O has flowed again after the fence
        filled = scribble(gpu2, "fill", device, "gpu-2")
        wrote = json.loads(writer.check().strip().splitlines()[-1])
        kept_trying = time.monotonic() - fenced_at
    finally:
        stack.cluster.restore_management("gpu-1")
    blocks = landed(stack, volume_id)
    report("partitioned gpu-1 fenced (NODE_CLEANUP_TIMEOUT): gpu-2's verified I/O on the shared volume", result.line())
    report("partitioned gpu-1 fenced: its writer", json.dumps(wrote))
    report("partitioned gpu-1 fenced: blocks on storage-1 by writer", json.dumps(blocks))
    assert result.errors == 0 and result.ios_after_last_stall > 0, result.errlog
    assert wrote["fenced_seen"] and kept_trying >= 2 * kato + LOSS, (wrote, kept_trying)
    assert wrote["direct_after"] == 0 and wrote["fsync_after"] == 0, wrote
    assert blocks["gpu-1"] == 0 and blocks["gpu-2"] == blocks["blocks"] == filled["blocks"], blocks
    csi(stack, "gpu-1", *on("partitioned", "unpublish", "unstage"))
    csi(stack, "gpu-2", *on("partitioned", *OFF, "delete"))


def test_a_node_frozen_for_less_than_its_keep_alive_is_fenced_and_nothing_it_held_lands_when_it_wakes(
    stack: ClusterDriver, report: Reporter
) -> None:
    kato = 120  # longer than the freeze: without a fence the target would still hold gpu-1's controllers
    params = {"keepAliveTmo": str(kato), "ctrlLossTmo": str(LOSS), "reconnectDelay": str(RECONNECT)}
    volume_id, node1, writer = start_on_gpu1(stack, "frozen", params, seconds=60 + LOSS, after=LOSS + 10)
    time.sleep(4)
    stack.cluster.freeze("gpu-1")  # mid-write: requests in flight, dirty pages in its cache
    frozen_at = time.monotonic()
    try:
        take_over(stack, "frozen", params, node1, "NODE_OUT_OF_SERVICE")
        filled = move_to_gpu2(stack, "frozen")
        frozen_for = time.monotonic() - frozen_at
    finally:
        stack.cluster.resume("gpu-1")
    stack.cluster.vm("gpu-1").write(MARKER, "")
    wrote = json.loads(writer.check().strip().splitlines()[-1])
    blocks = landed(stack, volume_id)
    report(f"gpu-1 frozen {frozen_for:.0f} s (keep-alive {kato} s), fenced (NODE_OUT_OF_SERVICE)", json.dumps(wrote))
    report("frozen gpu-1 fenced: blocks on storage-1 by writer", json.dumps(blocks))
    assert frozen_for < kato, "the freeze outlasted the keep-alive: the target would have ended gpu-1 anyway"
    assert wrote["direct_after"] == 0 and wrote["fsync_after"] == 0 and wrote["direct_err"] > 0, wrote
    assert blocks["gpu-1"] == 0 and blocks["gpu-2"] == blocks["blocks"] == filled["blocks"], blocks
    clean_up(stack, "frozen")


def test_a_node_that_skips_its_disconnect_after_a_plain_unpublish_writes_nothing_more(
    stack: ClusterDriver, report: Reporter
) -> None:
    """Security round 3, point 5: ControllerUnpublishVolume without a reason (a move: the CO believes gpu-1
    unstaged) of the volume's last host ends gpu-1's live connections, not only its grant. gpu-1 answers nothing
    and never disconnects, and keeps writing; gpu-2 then takes the volume and writes its pattern over every
    block: none of gpu-1's later writes land. Before, the target only refused new connections: gpu-1's live
    controllers went on writing over gpu-2's blocks."""
    kato = 5
    params = {"keepAliveTmo": str(kato), "ctrlLossTmo": str(LOSS), "reconnectDelay": str(RECONNECT)}
    volume_id, node1, writer = start_on_gpu1(stack, "unplugged", params, seconds=40 + 2 * kato + LOSS,
                                            after=2 * kato + LOSS + 4)  # fmt: skip
    time.sleep(4)
    create = on("unplugged", "create", size=32 * MiB, mode="block", params=params)
    csi(stack, "gpu-2", *create, *on("unplugged", "detach", node=node1))  # no reason: a plain unpublish
    stack.cluster.vm("gpu-1").write(MARKER, "")
    filled = move_to_gpu2(stack, "unplugged")
    wrote = json.loads(writer.check().strip().splitlines()[-1])
    blocks = landed(stack, volume_id)
    report("gpu-1 unpublished without unstaging: its writer", json.dumps(wrote))
    report("gpu-1 unpublished without unstaging: blocks on storage-1 by writer", json.dumps(blocks))
    assert wrote["fenced_seen"] and wrote["direct_after"] == 0 and wrote["fsync_after"] == 0, wrote
    assert wrote["direct_err"] > 0, wrote  # it kept trying, and the target refused it
    assert blocks["gpu-1"] == 0 and blocks["gpu-2"] == blocks["blocks"] == filled["blocks"], blocks
    clean_up(stack, "unplugged")
