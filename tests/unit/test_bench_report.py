"""bench/report.py: each figure oriented the right way, missing or malformed runs shown as not measured."""

from __future__ import annotations

import json
from pathlib import Path

from bench.report import FIGURES, load, main, measure


def test_lower_and_higher_is_better_figures_hold_on_the_right_side() -> None:
    provision = next(f for f in FIGURES if f.bench == "provision")
    assert provision.holds(1.2) and not provision.holds(1.3)
    assert provision.margin(2.5) == 0.5
    dataset = next(f for f in FIGURES if f.name.startswith("dataset hydration"))
    assert dataset.holds(3.1) and not dataset.holds(2.9)
    assert dataset.margin(6.0) == 2.0


def test_missing_and_malformed_runs_are_not_measured(tmp_path: Path) -> None:
    (tmp_path / "bench-stage.json").write_text(json.dumps({"ratio_median": 1.1}))
    (tmp_path / "bench-qos.json").write_text(
        json.dumps({"worst_error_pct": "n/a", "modify_to_in_force_s": [0.59, 0.07, 0.57]})
    )
    (tmp_path / "bench-dataset.json").write_text("{not json")
    rows = dict((f.name, v) for f, v in measure(load(tmp_path)))
    assert rows["NodeStage+NodePublish vs bare connect/mkfs/mount"] == 1.1
    assert rows["QoS achieved IOPS vs limit, worst error"] is None
    assert rows["QoS ModifyVolume reply to io.max in force"] == 0.59  # per-run figures: the worst
    assert rows["dataset hydration, cold / warm"] is None
    assert rows["provision create+delete, agent vs raw script with the same durability"] is None
    assert rows["data path through the driver vs raw namespace, worst fio job (mount, block)"] is None


def test_report_lists_every_figure_and_writes_the_plot(tmp_path: Path) -> None:
    (tmp_path / "bench-provision.json").write_text(json.dumps({"ratio_total": 7.4, "speedup_vs_script_ceiling": 0.95}))
    (tmp_path / "bench-pathloss.json").write_text(
        json.dumps(
            {
                "default_stall_s": 7.4,
                "errors": 0,
                "runs": [
                    {
                        "keep_alive_s": 2,
                        "stall_s": 3.3,
                        "stalls": [[2.0, 3.3]],
                        "timeline_ms": 100,
                        "timeline": [5, 0, 4],
                    },
                    {
                        "keep_alive_s": 5,
                        "stall_s": 7.4,
                        "stalls": [[2.0, 7.4]],
                        "timeline_ms": 100,
                        "timeline": [5, 0, 4],
                    },
                ],
                "fit_slope": 1.37,
                "fit_offset_s": 0.52,
            }
        )
    )
    assert main([str(tmp_path)]) == 0
    text = (tmp_path / "bench-report.md").read_text().replace("≤", "<=").replace("≥", ">=")
    assert (
        "| provision create+delete, agent vs bare configfs script (image fsync only) | 7.4x | <= 1.25x | **no** |"
        in text
    )
    assert (
        "| provisioning throughput, 16 clients vs 1, as a share of the machine's own ceiling | 0.95 | >= 0.9 | yes |"
        in text
    )
    assert "| black-holed path: I/O stall at the default keep-alive (5 s) | 7.4s | <= 6s | **no** |" in text
    assert (
        "| black-holed path: worst stall / the kernel's floor (1.5 x keep-alive + 1 s) | 0.87x | <= 1x | yes |" in text
    )
    assert text.count("not measured") >= len(FIGURES) - 6
    assert (tmp_path / "bench-goals.png").stat().st_size > 1000
    assert (tmp_path / "bench-curves.png").stat().st_size > 1000


def test_the_profile_of_the_agent_is_shown_largest_part_first(tmp_path: Path) -> None:
    profile = {
        "samples": 900,
        "cycles": 120,
        "agent_cpu_ms_per_cycle": 70.0,
        "wall_ms_per_cycle": 101.5,
        "pathlib_share": 0.081,
        "share": {"log lines": 0.095, "state records": 0.12, "configfs": 0.0, "gRPC and threads": 0.301},
    }
    (tmp_path / "bench-provision.json").write_text(json.dumps({"profile": profile}))
    assert main([str(tmp_path)]) == 0
    text = (tmp_path / "bench-report.md").read_text()
    assert "900 samples over 120 create+delete cycles of 101.5 ms, 70.0 ms of agent CPU each" in text
    assert "such as fsync): gRPC and threads 30%, state records 12%, log lines 10%; pathlib objects in 8%" in text


def test_the_contract_floor_is_shown_when_measured(tmp_path: Path) -> None:
    (tmp_path / "bench-provision.json").write_text(
        json.dumps(
            {
                "contract_ms_per_create": 30.5,
                "contract_ms_per_delete": 28.0,
                "ratio_contract_vs_durable": 1.21,
                "ratio_floor_contract_grpc": 1.8,
                "ratio_agent_vs_contract_grpc": 1.3,
            }
        )
    )
    assert main([str(tmp_path)]) == 0
    text = (tmp_path / "bench-report.md").read_text()
    assert "30.5 / 28.0 ms, 1.21x the durable script; with a bare round trip per call 1.8x. The agent is 1.3x" in text


def test_a_smoke_run_is_marked_not_a_measurement_and_a_full_run_is_not(tmp_path: Path) -> None:
    (tmp_path / "bench-provision.json").write_text(json.dumps({"ratio_total": 1.1, "smoke": True}))
    (tmp_path / "bench-stage.json").write_text(json.dumps({"ratio_median": 1.1, "smoke": False}))
    assert main([str(tmp_path)]) == 0
    text = (tmp_path / "bench-report.md").read_text()
    assert text.startswith("# Benchmark report — smoke: not a measurement")
    assert "**Smoke run** (provision)" in text and "`./dev bench`" in text
    (tmp_path / "bench-provision.json").write_text(json.dumps({"ratio_total": 1.1, "smoke": False}))
    assert main([str(tmp_path)]) == 0
    assert "smoke" not in (tmp_path / "bench-report.md").read_text().lower()


def test_scale_runs_give_their_figures_notes_and_curves(tmp_path: Path) -> None:
    level = {"create_p50_ms": 3.0, "create_p99_ms": 6.0, "delete_p50_ms": 3.0, "delete_p99_ms": 5.0}
    agent = {
        "samples": 10,
        "levels": [
            {**level, "volumes": 0, "list_page_ms": {"start": 1.0}, "start_s": 0.4, "rss_kib": 61000},
            {**level, "volumes": 200, "list_page_ms": {"start": 1.1, "end": 1.3}, "start_s": 0.5, "rss_kib": 62000},
        ],
        "create_p50_ratio": 1.0, "delete_p50_ratio": 1.0, "list_page_ratio": 1.18,
        "rss_kib_per_volume": 5.0, "start_ms_per_volume": 0.5,
    }  # fmt: skip
    fleet = {"create_p50_ms": 10.0, "create_p99_ms": 12.0, "delete_p50_ms": 7.0, "delete_p99_ms": 8.0}
    ctrl = {
        "samples": 8,
        "fleets": [{**fleet, "agents": 1}, {**fleet, "agents": 4, "create_p50_ms": 13.0}],
        "create_p50_ratio": 1.3,
        "one_dead": {**fleet, "agents": 4, "first_creates_ms": [3400.0], "refused_unavailable": 2, "tried": 8},
        "one_dead_create_p50_ratio": 0.77,
        "create_p50_ratio_over_direct": 1.1,
    }
    (tmp_path / "bench-scale-agent.json").write_text(json.dumps(agent))
    (tmp_path / "bench-scale-controller.json").write_text(json.dumps(ctrl))
    values = {f.name: v for f, v in measure(load(tmp_path)) if f.bench in ("scale-agent", "scale-controller")}
    assert values["controller CreateVolume p50 with the most agents / one agent"] == 1.3
    assert None not in values.values() and len(values) == 6
    assert main([str(tmp_path)]) == 0
    report = (tmp_path / "bench-report.md").read_text()
    assert "200: create 3.0/6.0 ms" in report and "2 of 8 creates were refused UNAVAILABLE" in report
    assert (tmp_path / "bench-curves.png").stat().st_size > 0


def test_the_agent_on_real_configfs_gives_its_own_part_as_a_figure_and_its_profile_as_a_note(tmp_path: Path) -> None:
    row = {"create_p50_ms": 20.0, "delete_p50_ms": 30.0, "raw_create_p50_ms": 5.0, "raw_delete_p50_ms": 20.0,
           "contract_create_p50_ms": 7.0, "contract_delete_p50_ms": 21.0, "start_s": 5.0}  # fmt: skip
    lab = {
        "kernel": "6.12", "samples": 50,
        "levels": [{**row, "volumes": 0}, {**row, "volumes": 4000, "create_p50_ms": 26.0, "contract_create_p50_ms": 14.0}],
        "create_p50_ratio": 1.3, "delete_p50_ratio": 1.0, "raw_create_p50_ratio": 2.2, "raw_delete_p50_ratio": 1.0,
        "contract_create_p50_ratio": 2.0, "contract_delete_p50_ratio": 1.0, "own_create_p50_ratio": 0.92,
        "cpu_ms_growth_by_part": {"configfs": 7.9, "state records": 0.3},
    }  # fmt: skip
    (tmp_path / "bench-scale-agent-lab.json").write_text(json.dumps(lab))
    values = {f.name: v for f, v in measure(load(tmp_path)) if f.bench == "scale-agent-lab"}
    assert list(values.values()) == [0.92]
    assert main([str(tmp_path)]) == 0
    report = (tmp_path / "bench-report.md").read_text()
    assert "by part (py-spy): configfs +7.9 ms, state records +0.3 ms" in report
    assert (tmp_path / "bench-curves.png").stat().st_size > 0


def test_the_node_at_scale_gives_its_own_code_as_figures_and_the_growth_by_part_as_notes(tmp_path: Path) -> None:
    row = {"pass_ms": 2.0, "pass_ms_per_volume": 0.2, "stats_ms": 0.1, "stage_publish_p50_ms": 18.0,
           "unpublish_unstage_p50_ms": 7.0, "mount_table_read_ms": 0.07, "rss_kib": 41000}  # fmt: skip
    node = {
        "samples": 24, "rounds": 4,
        "levels": [{**row, "volumes": 10}, {**row, "volumes": 200, "unpublish_unstage_p50_ms": 9.0}],
        "pass_per_volume_ratio": 1.0, "pass_ratio": 20.0, "stats_ratio": 1.0, "stage_ratio": 1.11,
        "unstage_ratio": 1.29, "kernel_floor_stage_ratio": 1.06, "kernel_floor_unstage_ratio": 1.22,
        "own_stage_ratio": 1.04, "own_unstage_ratio": 1.1,
        "stage_ms_added": {"total": 2.0, "mount table read": 1.7, "own": 0.2},
        "unstage_ms_added": {"total": 2.0, "mount table read": 1.5, "record names scan": 0.3, "umount": -0.2},
    }  # fmt: skip
    (tmp_path / "bench-scale-node.json").write_text(json.dumps(node))
    values = {f.name: v for f, v in measure(load(tmp_path)) if f.bench == "scale-node"}
    assert values["node NodeUnpublish+NodeUnstage, most volumes published / fewest"] == 1.29
    own = [v for name, v in values.items() if "own code" in name]
    assert own == [1.04, 1.1]
    assert main([str(tmp_path)]) == 0
    report = (tmp_path / "bench-report.md").read_text()
    assert "mount table read +1.50, record names scan +0.30, umount -0.20" in report
    assert "if only the programs and the mount-table reads grew: 1.22x" in report
