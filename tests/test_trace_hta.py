"""The trace as Holistic Trace Analysis reads it (structure level, without installing HTA).

HTA's parser (hta/common/trace_parser.py) loads the JSON, reads `distributedInfo.rank` for the rank,
keeps the complete events (ph "X") with name, cat, ts, dur, pid, tid and args, and treats the events
with cat "kernel" as GPU kernels: `args.stream` is the stream, `args.correlation` links to the launch, and
a kernel is communication when its name contains "nccl" (hta/utils/utils.py get_kernel_type). Kernels on
one stream must not overlap. Its CommunicationAnalysis reads the collective args PyTorch records
("Collective name", "Process Group Ranks", "Group size")."""

from __future__ import annotations

import json

import pytest

from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.sim.results.simulate import simulate


def hta_kernels(doc: dict) -> tuple[int, list[dict]]:
    """(rank, kernel rows) as HTA's parser would build them."""
    rank = int(doc["distributedInfo"]["rank"])
    rows = []
    for ev in doc["traceEvents"]:
        if ev.get("ph") != "X" or ev.get("cat") != "kernel":
            continue
        args = ev["args"]
        kernel_type = "COMMUNICATION" if "nccl" in ev["name"].lower() else "COMPUTATION"
        rows.append({"name": ev["name"], "ts": ev["ts"], "dur": ev["dur"], "pid": ev["pid"], "tid": ev["tid"],
                     "stream": int(args["stream"]), "correlation": int(args["correlation"]), "type": kernel_type,
                     "args": args})
    return rank, rows


@pytest.fixture(scope="module")
def trace_doc(tmp_path_factory):
    from meshsim.sim.outputs.trace import write_trace

    scenario, source = load_scenario("tiny-2gpu")
    result = simulate(resolve(with_overrides(scenario, {"parallel.dp": 2, "parallel.gpus": 4}, source), source))
    path = write_trace(tmp_path_factory.mktemp("t") / "trace.json", result.events, result.critical_path, result=result)
    return json.loads(path.read_text()), result


def test_distributed_info_and_kernels(trace_doc):
    doc, result = trace_doc
    rank, kernels = hta_kernels(doc)
    assert rank == 0 and doc["distributedInfo"]["world_size"] == 4 and doc["distributedInfo"]["backend"] == "nccl"
    assert len(kernels) == len(result.events)
    assert {k["type"] for k in kernels} == {"COMMUNICATION", "COMPUTATION"}
    comm = [k for k in kernels if k["type"] == "COMMUNICATION"]
    assert len(comm) == sum(e.category != "compute" for e in result.events)


def test_kernels_on_one_stream_do_not_overlap(trace_doc):
    _, kernels = trace_doc
    by_stream: dict[tuple[int, int], list] = {}
    for k in hta_kernels(trace_doc[0])[1]:
        by_stream.setdefault((k["pid"], k["stream"]), []).append((k["ts"], k["ts"] + k["dur"]))
    for spans in by_stream.values():
        spans.sort()
        assert all(a_end <= b_start + 1e-9 for (_, a_end), (b_start, _) in zip(spans, spans[1:], strict=False))


def test_collective_args_name_the_collective_group_size_and_algorithm(trace_doc):
    doc, result = trace_doc
    comm = [k for k in hta_kernels(doc)[1] if k["type"] == "COMMUNICATION"]
    for k in comm:
        args = k["args"]
        kind = args["Collective name"]
        assert k["name"].startswith(f"nccl:{kind} ") and kind in {"all_reduce", "all_gather", "reduce_scatter"}
        assert args["Group size"] == len(args["Process Group Ranks"]) and 0 in args["Process Group Ranks"]
        assert args["Process Group Name"] in {"tp", "dp"} and args["algorithm"] and args["protocol"]
        assert args["bytes"] > 0 and args["busbw (GB/s)"] > 0
    dp = [k for k in comm if k["args"]["Process Group Name"] == "dp"]
    assert dp and all(k["args"]["Process Group Ranks"] == [0, 2] for k in dp)  # TP innermost: rank 0's DP peers
    names = {e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"}
    assert names == {"sim rank 0 (tp 0, dp 0, node 0)"}
