"""A measured collective: which op, how many bytes, over how large a group, and its bus bandwidth.

Sources, first found wins: the NCCL kernel's own args (PyTorch >= 2.2 records "Collective name", "In msg
nelems", "Out msg nelems", "Group size", "dtype", "Process Group Ranks" on it), then the launching
`record_param_comms` or `nccl:<op>` / `gloo:<op>` annotation (its `Input Dims` and `Input type`), then
the kernel name (ncclKernel_AllReduce_RING_LL_Sum_float, ncclDevKernel_AllGather_RING_LL: op, algorithm,
protocol). The group size, when nothing says it: the only process group of more than one rank in
distributedInfo.pg_config, else the world size (flagged `assumed_group`).

Bytes follow nccl-tests (and meshsim's Collective.nbytes): the larger of the input and output message,
i.e. the buffer of an all-reduce, the gathered total of an all-gather or reduce-scatter.
busbw = nbytes / time x busbw_factor(op, group) (sim/cost/collectives/cost.py, nccl-tests' factors).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from meshsim.sim.cost.collectives import busbw_factor
from meshsim.sim.kineto.context import Launch
from meshsim.sim.kineto.records import DeviceEvent

DTYPE_BYTES = {"float": 4, "float32": 4, "float16": 2, "half": 2, "bfloat16": 2, "double": 8, "float64": 8,
               "int": 4, "int32": 4, "long": 8, "long int": 8, "int64": 8, "byte": 1, "char": 1, "uint8": 1,
               "int8": 1, "bool": 1, "short": 2, "int16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}
P2P_OPS = frozenset(("send", "recv", "sendrecv", "p2p"))
_KERNEL = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)(?:_([A-Z0-9]+))?(?:_(LL128|LL|SIMPLE))?", re.IGNORECASE)
_ALGOS = ("RING", "TREE", "NVLS", "NVLS_TREE", "COLLNET_DIRECT", "COLLNET_CHAIN", "PAT")
_OPS = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
        "alltoall": "all_to_all", "alltoallv": "all_to_all", "broadcast": "broadcast", "reduce": "reduce",
        "send": "send", "recv": "recv", "sendrecv": "sendrecv", "barrier": "barrier", "gather": "gather",
        "scatter": "scatter", "batchisendirecv": "p2p"}


@dataclass(frozen=True)
class CollectiveInfo:
    op: str  # all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, reduce, send, recv, ...
    nbytes: int
    group: int | None  # ranks in the group
    dtype: str
    algo: str = ""
    protocol: str = ""
    pg: str = ""  # process group name / description
    ranks: tuple[int, ...] = ()
    assumed_group: bool = False

    @property
    def p2p(self) -> bool:
        return self.op in P2P_OPS

    def busbw_gbps(self, dur_us: float) -> float | None:
        """Bus bandwidth (GB/s) of one run of `dur_us`; None when the group size or op has no factor."""
        if dur_us <= 0 or not self.nbytes or not self.group or self.p2p:
            return None
        try:
            factor = busbw_factor(self.op, self.group)
        except ValueError:
            return None
        return self.nbytes / (dur_us * 1e-6) * factor / 1e9


def normalize_op(name: str) -> str:
    """'allreduce', '_reduce_scatter_base', 'allgather_into_tensor_coalesced', 'nccl:all_to_all' -> meshsim's op."""
    key = name.split(":", 1)[-1].lower()
    for noise in ("_coalesced", "_into_tensor", "_tensor", "_base", "_single", "coalesced"):
        key = key.replace(noise, "")
    key = key.replace("_", "")
    return _OPS.get(key, key)


def dtype_bytes(dtype: object) -> int:
    key = str(dtype).lower().replace("c10::", "").replace("torch.", "")
    return DTYPE_BYTES.get(key, 4)


MAX_ELEMENTS = 1 << 53  # a message of more elements is not a recorded one (sim/kineto/load.py checks the args)


def _ranks(value: object) -> tuple[int, ...]:
    """Ranks as recorded: a list, or its text ("[0, 1]"; load.py refuses numbers of more than 9 digits)."""
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value if isinstance(v, int))
    if isinstance(value, str):
        return tuple(int(v) for v in re.findall(r"-?\d{1,9}", value))
    return ()


def _elements(dims: tuple) -> int:
    best = 0
    for d in dims:
        while isinstance(d, tuple) and d and isinstance(d[0], tuple):
            d = d[0]
        if isinstance(d, tuple) and d and all(isinstance(x, int) for x in d):
            n = 1
            for x in d:
                n *= x
            if n <= MAX_ELEMENTS:
                best = max(best, n)
    return best


def collective_info(ev: DeviceEvent, launch: Launch, default_group: int | None) -> CollectiveInfo:
    """The collective a communication kernel (or gloo span) runs (module docstring)."""
    args = dict(ev.args or {})
    comm = launch.comm_op
    if comm is not None and comm.args:
        args = {**comm.args, **args}
    kernel = _KERNEL.search(ev.name)
    op = args.get("Collective name") or (comm.name if comm is not None and ":" in comm.name else None)
    op = normalize_op(str(op)) if op else normalize_op(kernel.group(1)) if kernel else "unknown"
    dtype = str(args.get("dtype") or (comm.types[0] if comm is not None and comm.types else "float"))
    nelems = max(int(args.get("In msg nelems") or 0), int(args.get("Out msg nelems") or 0))
    if not nelems and comm is not None:
        nelems = _elements(comm.dims)
    ranks = _ranks(args.get("Process Group Ranks"))
    group = args.get("Group size") if type(args.get("Group size")) is int else (len(ranks) or None)
    assumed = group is None
    group = group or default_group
    algo = kernel.group(2).upper() if kernel and kernel.group(2) and kernel.group(2).upper() in _ALGOS else ""
    proto = kernel.group(3).upper() if kernel and kernel.group(3) else ""
    pg = str(args.get("Process Group Description") or args.get("Process Group Name") or "")
    return CollectiveInfo(op=op, nbytes=nelems * dtype_bytes(dtype), group=group, dtype=dtype, algo=algo,
                          protocol=proto, pg=pg, ranks=ranks, assumed_group=assumed and group is not None)
