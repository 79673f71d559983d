"""The report's lines on how costs grow with the fleet (``bench/scale_agent.py``, ``bench/scale_controller.py``,
``bench/scale_node.py``, ``bench/k8s_pvcs.py``): each level's numbers as measured, so the curves can be read as
figures too.

Contract: a pure function of the result documents; a document missing or lacking a field adds no line.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

Doc = Mapping[str, Any]


def scale_notes(docs: Mapping[str, Doc]) -> list[str]:
    out = []
    with contextlib.suppress(KeyError, TypeError, IndexError):
        agent = docs["scale-agent"]
        levels = "; ".join(
            f"{r['volumes']}: create {r['create_p50_ms']}/{r['create_p99_ms']} ms, delete {r['delete_p50_ms']}/"
            f"{r['delete_p99_ms']} ms, page {max(r['list_page_ms'].values())} ms, start {r['start_s']} s, RSS "
            f"{round(r['rss_kib'] / 1024, 1)} MiB"
            for r in agent["levels"]
        )
        out.append(
            f"- agent with N volumes held (p50/p99; {agent['samples']} samples each): {levels}. Start-up grows "
            f"{agent['start_ms_per_volume']} ms and RSS {agent['rss_kib_per_volume']} KiB per volume."
        )
    with contextlib.suppress(KeyError, TypeError, IndexError):
        lab = docs["scale-agent-lab"]
        levels = "; ".join(
            f"{r['volumes']}: create {r['create_p50_ms']} ms (bare script {r['raw_create_p50_ms']}, contract "
            f"{r['contract_create_p50_ms']}), delete {r['delete_p50_ms']} ms (bare {r['raw_delete_p50_ms']}, contract "
            f"{r['contract_delete_p50_ms']}), start {r['start_s']} s"
            for r in lab["levels"]
        )
        out.append(
            f"- agent on the kernel's nvmet configfs (lab VM, {lab['kernel']}, p50 of {lab['samples']}): {levels}. "
            f"From the fewest to the most: the agent's create {lab['create_p50_ratio']}x, delete "
            f"{lab['delete_p50_ratio']}x; the bare durable configfs script's {lab['raw_create_p50_ratio']}x and "
            f"{lab['raw_delete_p50_ratio']}x, the agent's own system calls as a script "
            f"{lab['contract_create_p50_ratio']}x and {lab['contract_delete_p50_ratio']}x (the kernel's own growth)."
        )
        grew = ", ".join(
            f"{k} {v:+} ms" for k, v in sorted(lab["cpu_ms_growth_by_part"].items(), key=lambda kv: -kv[1])
        )
        out.append(
            f"  - the agent's CPU per create+delete added from the fewest to the most, by part (py-spy): {grew}."
        )
    with contextlib.suppress(KeyError, TypeError, IndexError):
        ctrl = docs["scale-controller"]
        fleets = "; ".join(
            f"{r['agents']} agents: create {r['create_p50_ms']}/{r['create_p99_ms']} ms (its agent calls sent "
            f"straight: {r.get('direct_create_p50_ms', '?')} ms), delete {r['delete_p50_ms']}/{r['delete_p99_ms']} ms"
            for r in ctrl["fleets"]
        )
        dead = ctrl["one_dead"]
        out.append(
            f"- controller over N agents (p50/p99; {ctrl['samples']} samples each): {fleets}. The bare calls grow "
            f"{ctrl.get('direct_create_p50_ratio', '?')}x from the fewest agents to the most (more processes on 2 "
            f"vCPUs, colder caches), the controller {ctrl['create_p50_ratio']}x: its own growth "
            f"{ctrl.get('create_p50_ratio_over_direct', '?')}x. One of "
            f"{dead['agents']} killed: the first creates took {dead['first_creates_ms']} ms (one probe of the dead "
            f"agent), then p50 {dead['create_p50_ms']} ms; {dead['refused_unavailable']} of {dead['tried']} creates "
            "were refused UNAVAILABLE (a name whose home is the dead agent waits for it)."
        )
    with contextlib.suppress(KeyError, TypeError, IndexError):
        nodes = docs["scale-node"]
        levels = "; ".join(
            f"{r['volumes']}: pass {r['pass_ms']} ms ({r['pass_ms_per_volume']} ms per volume), stats {r['stats_ms']} "
            f"ms, stage+publish {r['stage_publish_p50_ms']} ms, unpublish+unstage "
            f"{r.get('unpublish_unstage_p50_ms', '?')} ms, RSS {round(r['rss_kib'] / 1024, 1)} MiB"
            for r in nodes["levels"]
        )
        out.append(f"- node with N volumes published (loop backend, medians): {levels}.")
        for way, key in (("stage+publish", "stage"), ("unpublish+unstage", "unstage")):
            grew = ", ".join(f"{k} {v:+.2f}" for k, v in nodes[f"{key}_ms_added"].items() if k != "total")
            out.append(
                f"  - {way}, ms added by part from the fewest to the most: {grew}; if only the programs and the "
                f"mount-table reads grew: {nodes[f'kernel_floor_{key}_ratio']}x, the node's own part "
                f"{nodes[f'own_{key}_ratio']}x ({nodes.get('rounds', 1)} alternating rounds)"
            )
    with contextlib.suppress(KeyError, TypeError, IndexError):
        pvcs = docs["k8s-pvcs"]
        passes = "; ".join(
            f"{r['pass']}: all Bound in {r['all_bound_s']} s ({r['creates_per_s']} creates/s), all deleted in "
            f"{r['all_deleted_s']} s; our controller busy {r['controller_create_s']} s in "
            f"{r['controller_create_calls']} CreateVolume calls ({r['controller_share']} of the wall time); the "
            f"provisioner waited {r['throttled_waits']} times ({r['throttled_s']} s) on its API rate limiter"
            for r in pvcs["passes"]
        )
        out.append(f"- {pvcs['count']} PVCs at once through the real external-provisioner (Kubernetes tier): {passes}.")
        out += [f"  - {r['pass']}, while creating: {cpu_line(r['cpu_while_creating'])}" for r in pvcs["passes"]
                if "cpu_while_creating" in r]  # fmt: skip
        for r in pvcs["passes"]:
            agents = r.get("agent_calls_while_creating", {})
            threads = list(r.get("controller_threads_while_creating", {}).get("threads", {}).items())[:4]
            if agents or threads:
                spent_s = ", ".join(f"{m} {v['seconds']} s ({v['calls']})" for m, v in agents.items())
                where = "; ".join(f"{k}: {n}" for k, n in threads)
                out.append(f"  - {r['pass']}: in the agents {spent_s}; the controller's threads (py-spy) {where}")
    return out


def cpu_line(cpu: Doc) -> str:
    """Where the CPU went (bench/k8s_cpu.py): per node VM its busiest parts (share of one CPU) and how busy the
    VM was, then the control plane's processes on the host."""
    nodes = "; ".join(
        f"{node} ({n['cpus']} vCPUs, {round(100 * n['vm_busy_share'])} % busy): "
        + ", ".join(f"{part} {share}" for part, share in list(n["parts"].items())[:4])
        for node, n in cpu["nodes"].items()
    )
    plane = ", ".join(f"{k} {v}" for k, v in sorted(cpu["control_plane"].items(), key=lambda kv: -kv[1]))
    host = f"; this host {round(100 * cpu['host_busy_share'])} % busy" if "host_busy_share" in cpu else ""
    return f"{nodes}; control plane on the host: {plane} (CPUs busy){host}"
