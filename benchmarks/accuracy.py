"""Accuracy report: simulated vs measured on the public calibration set (reference/public-measurements.md).

    python benchmarks/accuracy.py                 # default cost models (no profile)
    python benchmarks/accuracy.py --profile P.yaml  # every case on a calibrated profile (meshsim calibrate)
    python benchmarks/accuracy.py --only ci-       # cases whose name starts with a prefix

Groups, each with its MAPE (mean absolute percentage error) and max:
- iteration: one training step per scenario file in benchmarks/accuracy/*.yaml (assumptions beside each
  field); cases the simulator refuses (pipeline parallelism before parallel.pp lands) print "needs
  parallel.pp" and are left out of the MAPE, which says how many it left out;
- scaling: ratios of two measured steps (TP weak scaling, DP scaling) against the same simulated ratio;
- collectives: nccl-tests all_reduce_perf bus bandwidth by message size (target: within 10% from 16 MB up);
- kernels: FLUX's GEMM and NCCL collective times of GPT-3 175B MLP shapes at TP 8 (A800 / H800).
Error = simulated / measured - 1: negative means the simulation is too fast. Nothing here is asserted.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from meshsim.scenarios.load import load_scenario, resolve, validate_scenario, with_overrides
from meshsim.sim.core.errors import UserError
from meshsim.sim.results.simulate import CollectiveCoster, compute_fn, simulate
from meshsim.sim.schedule.ops import Collective, Gemm, Op

HERE = Path(__file__).resolve().parent / "accuracy"
MIB = 1 << 20

# measured iteration time (s) per case file (public-measurements.md sections 1-3)
MEASURED_S = {
    "megatron2020-a100-1.16b-tp1-dp1": 1.076, "megatron2020-a100-2.03b-tp2-dp1": 1.026,
    "megatron2020-a100-4.24b-tp4-dp1": 1.162, "megatron2020-a100-8.67b-tp8-dp1": 1.343,
    "megatron2020-a100-1.16b-tp1-dp128": 1.153, "megatron2020-a100-2.03b-tp2-dp128": 1.101,
    "megatron2020-a100-4.24b-tp4-dp128": 1.242, "megatron2020-a100-8.67b-tp8-dp128": 1.380,
    "megatron2020-v100-1.16b-tp1-dp1": 1.121, "megatron2020-v100-2.03b-tp2-dp1": 1.093,
    "megatron2020-v100-4.24b-tp4-dp1": 1.238, "megatron2020-v100-8.67b-tp8-dp1": 1.407,
    "ci-gpt3-7b-tp4-pp1-h100": 1.115, "ci-gpt3-7b-tp4-pp1-a100": 2.59, "ci-gpt3-7b-tp4-pp1-gb200": 0.853,
    "ci-gpt3-7b-tp1-pp4-h100": 1.150, "ci-gpt3-7b-tp1-pp4-a100": 2.94, "ci-gpt3-7b-tp1-pp4-gb200": 0.787,
    **{f"nemo-gpt3-5b-{n}node": 2048 * 2048 / tok for n, tok in
       {1: 40345, 2: 79815, 4: 161754, 8: 312774, 16: 659481, 32: 1159288}.items()},
}
# scaling ratios: (label, numerator case, denominator case); measured and simulated as step-time ratios
SCALING = [(f"2020 A100 TP weak scaling {b} / tp1", b, "megatron2020-a100-1.16b-tp1-dp1")
           for b in ("megatron2020-a100-2.03b-tp2-dp1", "megatron2020-a100-4.24b-tp4-dp1",
                     "megatron2020-a100-8.67b-tp8-dp1")]
SCALING += [(f"2020 V100 TP weak scaling {b} / tp1", b, "megatron2020-v100-1.16b-tp1-dp1")
            for b in ("megatron2020-v100-2.03b-tp2-dp1", "megatron2020-v100-4.24b-tp4-dp1",
                      "megatron2020-v100-8.67b-tp8-dp1")]
SCALING += [(f"2020 A100 dp128 / dp1, {m}", f"megatron2020-a100-{m}-dp128", f"megatron2020-a100-{m}-dp1")
            for m in ("1.16b-tp1", "2.03b-tp2", "4.24b-tp4", "8.67b-tp8")]
SCALING += [(f"NeMo 5B step {n} nodes / 1 node", f"nemo-gpt3-5b-{n}node", "nemo-gpt3-5b-1node")
            for n in (2, 4, 8, 16, 32)]
# nccl-tests all_reduce_perf busbw (GB/s) by size (bytes): (label, preset, gpu count, forced algo, points)
NCCL_TESTS = [
    ("8x A100 (ND A100 v4)", "dgx-a100", 8, "auto",
     {1: 36.2, 4: 71.4, 16: 109.2, 64: 166.6, 128: 174.2, 256: 213.9, 512: 221.6, 1024: 228.1,
      2048: 230.2, 8192: 231.6}),
    ("4x GB200 ring (ND GB200 v6)", "gb200-nvl72", 4, "ring",
     {1: 80.5, 8: 253.5, 64: 550.7, 512: 618.7, 1024: 646.9, 8192: 679.6}),
]
# FLUX (bytedance/flux README), TP 8, fp16, M = 4096: (label, gpu, work, measured ms)
FLUX_AG = Collective("all_gather", "tp", 4096 * 12288 * 2, "flux")
FLUX_RS = Collective("reduce_scatter", "tp", 4096 * 12288 * 2, "flux")
FLUX = [
    ("A800 GEMM 4096x12288 @ 12288x6144", "a100-80gb", Gemm(4096, 6144, 12288), 2.438),
    ("A800 GEMM 4096x6144 @ 6144x12288", "a100-80gb", Gemm(4096, 12288, 6144), 2.453),
    ("H800 GEMM 4096x12288 @ 12288x6144", "h100-sxm", Gemm(4096, 6144, 12288), 0.846),
    ("H800 GEMM 4096x6144 @ 6144x12288", "h100-sxm", Gemm(4096, 12288, 6144), 0.818),
    ("A800 all-gather 96 MiB (TP 8)", "a100-80gb", FLUX_AG, 0.662),
    ("A800 reduce-scatter 96 MiB (TP 8)", "a100-80gb", FLUX_RS, 0.646),
    ("H800 all-gather 96 MiB (TP 8)", "h100-sxm", FLUX_AG, 0.583),
    ("H800 reduce-scatter 96 MiB (TP 8)", "h100-sxm", FLUX_RS, 0.590),
]
FLUX_PRESET = {"a100-80gb": "dgx-a100", "h100-sxm": "dgx-h100"}
EXPORT_NVLINK_GBPS = 200.0  # A800 / H800: NVLink cut to 400 GB/s bidirectional = 200 per direction


@dataclass(frozen=True)
class Row:
    group: str
    label: str
    measured: float
    simulated: float | None  # None: refused (note says why)
    unit: str
    note: str = ""

    @property
    def error(self) -> float | None:
        return None if self.simulated is None else self.simulated / self.measured - 1.0


def _profiled(scenario, source: str, profile: str | None):
    return with_overrides(scenario, {"hardware.profile": str(Path(profile).resolve())}, source) if profile else scenario


def iteration_rows(profile: str | None, only: str) -> list[Row]:
    rows = []
    for path in sorted(HERE.glob("*.yaml")):
        if path.stem not in MEASURED_S or not path.stem.startswith(only):
            continue
        scenario, source = load_scenario(path)
        try:
            step_s = simulate(resolve(_profiled(scenario, source, profile), source)).step_time_s
            rows.append(Row("iteration", path.stem, MEASURED_S[path.stem], step_s, "s"))
        except UserError as err:
            note = "needs parallel.pp" if err.field.startswith("parallel.pp") else f"refused: {err.field}"
            rows.append(Row("iteration", path.stem, MEASURED_S[path.stem], None, "s", note))
    return rows


def scaling_rows(iteration: list[Row]) -> list[Row]:
    by = {r.label: r for r in iteration}
    rows = []
    for label, num, den in SCALING:
        if num in by and den in by:
            a, b = by[num], by[den]
            sim = a.simulated / b.simulated if a.simulated and b.simulated else None
            rows.append(Row("scaling", label, a.measured / b.measured, sim, "x"))
    return rows


def _bare_scenario(preset: str, gpus: int, gpu: str, profile: str | None, algo: str = "auto",
                   nvlink_gbps: float | None = None):
    """A minimal resolved scenario on `gpus` GPUs of `preset`, all in one TP group (costing only)."""
    data = {"name": f"accuracy-{preset}", "model": {"layers": 1, "hidden": 1024, "heads": 8, "seq_len": 128,
                                                    "vocab": 1024},
            "hardware": {"gpu": gpu, "network": {"algo": algo}}, "topology": {"preset": preset},
            "parallel": {"tp": gpus, "gpus": gpus, "dp": 1, "global_batch": 1}}
    if nvlink_gbps:
        data["topology"]["nvlink_gbps"] = nvlink_gbps
    if profile:
        data["hardware"]["profile"] = str(Path(profile).resolve())
    return resolve(validate_scenario(data, "benchmarks/accuracy.py"), "benchmarks/accuracy.py")


def collective_rows(profile: str | None) -> list[Row]:
    rows = []
    for label, preset, gpus, algo, points in NCCL_TESTS:
        rs = _bare_scenario(preset, gpus, "b200" if "gb200" in preset else "a100-80gb", profile, algo)
        coster = CollectiveCoster(rs)
        for mib, busbw in points.items():
            nbytes = mib * MIB
            latency_s, bandwidth_s, _ = coster.cost(Collective("all_reduce", "tp", nbytes), rs.tp_group(0))[0]
            sim_busbw = nbytes / (latency_s + bandwidth_s) * 2 * (gpus - 1) / gpus / 1e9
            size = f"{mib // 1024} GiB" if mib >= 1024 else f"{mib} MiB"
            note = "" if mib >= 16 else "below 16 MiB: not in the target"
            rows.append(Row("collectives", f"{label} all_reduce {size} busbw", busbw, sim_busbw, "GB/s", note))
    return rows


def kernel_rows(profile: str | None) -> list[Row]:
    rows = []
    for label, gpu, work, measured_ms in FLUX:
        rs = _bare_scenario(FLUX_PRESET[gpu], 8, gpu, profile, nvlink_gbps=EXPORT_NVLINK_GBPS)
        op = Op(0, label, "compute", "compute", "fwd", work)
        if isinstance(work, Collective):
            latency_s, bandwidth_s, _ = CollectiveCoster(rs).cost(work, rs.tp_group(0))[0]
            sim_s = latency_s + bandwidth_s
        else:
            sim_s = compute_fn(rs)(op, 0)
        rows.append(Row("kernels", label, measured_ms, sim_s * 1e3, "ms"))
    return rows


def summary(rows: list[Row], name: str, target: str = "") -> str:
    counted = [r for r in rows if r.error is not None and not r.note.startswith("below")]
    left_out = [r for r in rows if r.error is None]
    if not counted:
        return f"{name} MAPE n/a (no case ran)"
    errs = [abs(r.error) * 100 for r in counted]
    line = f"{name} MAPE {sum(errs) / len(errs):.1f}% (max {max(errs):.1f}%) over {len(counted)} cases"
    if left_out:
        line += f"; {len(left_out)} left out ({', '.join(sorted({r.note for r in left_out}))})"
    return line + (f"; target {target}" if target else "")


def print_rows(rows: list[Row]) -> None:
    for r in rows:
        sim = "-" if r.simulated is None else f"{r.simulated:9.3f}"
        err = r.note if r.error is None else f"{r.error * 100:+6.1f}%" + (f"  ({r.note})" if r.note else "")
        print(f"  {r.label:58s} {r.measured:9.3f} {sim:>9s} {r.unit:5s} {err}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", help="hardware profile YAML from meshsim calibrate, applied to every case")
    ap.add_argument("--only", default="", help="only iteration cases whose name starts with this prefix")
    args = ap.parse_args(argv)
    iteration = iteration_rows(args.profile, args.only)
    groups = [("iteration", iteration, "iteration-time", "<= 5% (max <= 10%)"),
              ("scaling", scaling_rows(iteration), "scaling-ratio", ""),
              ("collectives", collective_rows(args.profile), "nccl-tests busbw (>= 16 MiB)", "<= 10% per point"),
              ("kernels", kernel_rows(args.profile), "FLUX kernel-time", "")]
    print(f"{'case':60s} {'measured':>9s} {'simulated':>9s} unit  error (simulated / measured - 1)")
    for name, rows, _, _ in groups:
        print(f"[{name}]")
        print_rows(rows)
    print()
    for _, rows, title, target in groups:
        print(summary(rows, title, target))
    return 0


if __name__ == "__main__":
    sys.exit(main())
