"""Multi-rack NVL72 all-reduce rows for benchmarks/accuracy.py (issue 42 item 2): the curves and fits of
benchmarks/accuracy/nvl72.yaml, priced on `racks` NVLink domains of the preset (meshsim picks NCCL's
algorithm: NVLS tree across racks, sim/cost/collectives/nvls_tree.py).

    python benchmarks/accuracy_nvl72.py     # these rows alone
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml
from accuracy_cases import MIB, Fit, used_in_fit
from accuracy_rows import SMALL_MIB, Context, Row

from meshsim.sim.cost.collectives import collective_cost
from meshsim.topologies.registry import build_topology

HERE = Path(__file__).resolve().parent / "accuracy" / "nvl72.yaml"


def _doc() -> dict:
    return yaml.safe_load(HERE.read_text(encoding="utf-8"))


def fits() -> list[Fit]:
    return [Fit(f["name"], f["value"], f["where"], f["how"], tuple(f["cases"])) for f in _doc()["fits"]]


def curve_rows(ctx: Context) -> list[Row]:
    """One row per point: busbw = nbytes / time x 2(n-1)/n, the all-reduce over every GPU of the racks."""
    rows = []
    for c in _doc()["curves"]:
        topo = build_topology(c["preset"], int(c["racks"]))
        ranks = list(range(topo.num_gpus))
        for mib, busbw in sorted((int(k), float(v)) for k, v in c["busbw_gbps"].items()):
            cost = collective_cost(topo, "all_reduce", ranks, mib * MIB, algo=c["algo"])
            name = f"{c['id']}-{mib}"
            size = f"{mib // 1024} GiB" if mib >= 1024 else f"{mib} MiB"
            group = "collectives" if mib >= SMALL_MIB else "collectives-small"
            rows.append(Row(group, name, f"{c['label']} all_reduce {size} busbw ({cost.algo})", busbw,
                            cost.busbw_gbps, "GB/s", used_in_fit=ctx.used.get(name, ())))
    return rows


def main() -> int:
    ctx = Context(None, "", used_in_fit(fits()))
    for r in curve_rows(ctx):
        print(f"  {r.label:70s} {r.measured:8.1f} {r.simulated:8.1f} {r.error * 100:+6.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
