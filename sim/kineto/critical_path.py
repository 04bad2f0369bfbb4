"""The critical path of one rank's step as Holistic Trace Analysis computes it (its "lightweight critical
path analysis": hta/analyzers/critical_path_analysis.py CPGraph, HolisticTraceAnalysis f4d0062).

Graph: every CPU operator and CUDA runtime call, and every GPU kernel with a known launch, gets a start
and an end node (points in time, ordered by time). Edges (weight = time between the nodes, except
dependency edges, weight 0):
- operator: along each thread's call stack, depth first: parent start -> first child start -> child
  end -> next child start ... -> parent end; consecutive top-level operators are linked by a dependency
  edge (weight 0); a blocking call (cudaDeviceSynchronize, cudaStreamSynchronize, cudaEventQuery,
  cudaEventSynchronize, cudaMemcpy, cudaMemcpyAsync) has a zero-weight span (_construct_graph_from_call_stack);
  the backward thread (the one with "autograd" operators) is merged into the forward thread;
- runtime lock: cudaLaunchKernel / cudaMemcpyAsync / cudaHostAlloc calls of different threads are
  ordered by their completion (_construct_graph_from_cuda_runtime_events);
- kernels: each kernel's span; then a launch-delay edge from its runtime call's start when its stream
  had nothing outstanding (queue length 1 after the launch, 0 after the kernel) and the stream's last
  kernel ended before the launch; else a kernel-kernel edge from the stream's last kernel end if the gap
  is under KERNEL_KERNEL_DELAY_THRESHOLD_US = 1500 (_construct_graph_from_kernels; queue lengths as
  hta/analyzers/trace_counters.py: +1 per launch, -1 per kernel, per stream).
The critical path is the longest path of this DAG (networkx dag_longest_path in HTA; here a topological
order and one relaxation pass). Each edge on it is bound by (CPGraph.bound_by): cpu_bound (a CPU
operator's span), gpu_compute_bound / gpu_communication_bound (a kernel's span, NCCL or not),
gpu_kernel_kernel_overhead, gpu_kernel_launch_overhead.
Not reproduced: CUDA synchronization events (cat cuda_sync: stream / context / event syncs, traces of
PyTorch >= 2.1 with them enabled), which add zero-weight GPU -> CPU edges; data-loading regexes.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict, deque
from collections.abc import Sequence

from meshsim.sim.kineto.classify import category
from meshsim.sim.kineto.context import RUNTIME_CATS
from meshsim.sim.kineto.kernels import Kernel
from meshsim.sim.kineto.records import HostOp

KERNEL_KERNEL_DELAY_THRESHOLD_US = 1500
LOCK_CALLS = frozenset(("cudaHostAlloc", "cudaLaunchKernel", "cudaMemcpyAsync"))
BLOCKING_CALLS = frozenset(("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventQuery",
                            "cudaEventSynchronize", "cudaMemcpy", "cudaMemcpyAsync"))
BOUNDS = ("cpu_bound", "gpu_compute_bound", "gpu_communication_bound", "gpu_kernel_kernel_overhead",
          "gpu_kernel_launch_overhead")
OP, DEP, LAUNCH, KK = "operator", "dependency", "launch", "kernel_kernel"


class _Graph:
    def __init__(self, starts: Sequence[float], ends: Sequence[float]) -> None:
        n = len(starts)
        times = list(starts) + list(ends)  # node i: start of event i; node n + i: its end
        self.order = sorted(range(2 * n), key=lambda v: (times[v], v % n))
        self.times, self.n = times, n
        self.edges: dict[int, list[tuple[int, float, str, int]]] = defaultdict(list)

    def add(self, u: int, v: int, kind: str, event: int, zero: bool = False) -> None:
        if u == v:
            return
        w = 0.0 if kind == DEP or zero else max(0.0, self.times[v] - self.times[u])
        self.edges[u].append((v, w, kind, event))

    def longest(self) -> list[tuple[float, str, int]]:
        """(weight, kind, event) of the edges of the longest path (Kahn order, one relaxation pass)."""
        indeg = [0] * (2 * self.n)
        for outs in self.edges.values():
            for v, *_ in outs:
                indeg[v] += 1
        queue = deque(v for v in self.order if indeg[v] == 0)
        dist, best = [0.0] * (2 * self.n), [None] * (2 * self.n)
        while queue:
            u = queue.popleft()
            for v, w, kind, ev in self.edges.get(u, ()):
                if dist[u] + w > dist[v] or best[v] is None and dist[u] + w >= dist[v]:
                    dist[v], best[v] = dist[u] + w, (u, w, kind, ev)
                indeg[v] -= 1
                if indeg[v] == 0:
                    queue.append(v)
        node = max(range(2 * self.n), key=dist.__getitem__, default=None)
        path = []
        while node is not None and best[node] is not None:
            u, w, kind, ev = best[node]
            path.append((w, kind, ev))
            node = u
        return path[::-1]


def _main_threads(host: Sequence[HostOp]) -> dict[int, int]:
    """{backward tid: forward tid} when exactly one thread has 'forward' and one 'autograd' operators."""
    fwd = {op.tid for op in host if op.cat in ("cpu_op", "user_annotation") and "forward" in op.name}
    bwd = {op.tid for op in host if op.cat in ("cpu_op", "user_annotation") and "autograd" in op.name}
    if len(fwd) == 1 and len(bwd) == 1 and fwd != bwd:
        return {next(iter(bwd)): next(iter(fwd))}
    return {}


def _cpu_edges(g: _Graph, cpu: Sequence[HostOp], remap: dict[int, int]) -> None:
    n = g.n
    lock = [op.name in LOCK_CALLS for op in cpu]
    open_starts: list[int] = []  # runtime-lock calls: the lock path follows their completions
    last = None
    for v in g.order:
        i = v % n
        if i >= len(cpu) or not lock[i]:
            continue
        if v < n:
            open_starts.append(v)
        else:
            while open_starts:
                s = open_starts.pop()
                g.add(s, v, OP if s == i else DEP, i)
            if last is not None and last >= n:  # the previous lock node was an end
                g.add(last, v, DEP, i)
        last = v

    threads: dict[int, list[int]] = defaultdict(list)
    for i, op in enumerate(cpu):
        threads[remap.get(op.tid, op.tid)].append(i)
    for idx in threads.values():
        idx.sort(key=lambda i: (cpu[i].ts, -cpu[i].dur))
        _stack_edges(g, cpu, idx, lock)


def _stack_edges(g: _Graph, cpu: Sequence[HostOp], idx: Sequence[int], lock: Sequence[bool]) -> None:
    """One thread's call-stack edges, depth first (HTA's enter_func / exit_func)."""
    n = g.n

    def shares_lock(a: int, b: int) -> bool:
        return lock[a % n] and lock[b % n] and (a < n or b >= n)

    stack: list[int] = []
    last, depth = None, 0
    for i in list(idx) + [None]:
        while stack and (i is None or cpu[stack[-1]].end <= cpu[i].ts):
            j = stack.pop()
            if last is not None and not shares_lock(last, n + j):
                g.add(last, n + j, OP, j, zero=cpu[j].name in BLOCKING_CALLS)
            last, depth = n + j, depth - 1
        if i is None:
            break
        if last is not None and not shares_lock(last, i):
            g.add(last, i, DEP if depth == 0 else OP, i)
        last, depth = i, depth + 1
        stack.append(i)


def _queue_lengths(kernels: Sequence[Kernel]) -> dict[int, tuple[int, int]]:
    """id(kernel) -> (queue length after its launch, after it ran) on its stream."""
    marks: dict[int, list[tuple[float, int, int]]] = defaultdict(list)
    for k in kernels:
        if k.launch.ts >= 0:
            marks[k.ev.stream] += [(k.launch.ts, 0, id(k)), (k.ev.ts, 1, id(k))]
    out: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for series in marks.values():
        q = 0
        for _, kind, key in sorted(series):
            q += 1 if kind == 0 else -1
            out[key][kind] = q
    return {k: (v[0], v[1]) for k, v in out.items()}


class RankIndex:
    """What every step of one rank shares, computed once (not once per step): its CPU operators and
    runtime calls in host order (thread, start) with each thread's range, the backward-thread merge, and
    the queue lengths of its kernels."""

    def __init__(self, host: Sequence[HostOp], all_kernels: Sequence[Kernel]) -> None:
        cats = ("cpu_op",) + tuple(RUNTIME_CATS)
        self.ops = [op for op in host if op.cat in cats]  # host order: (tid, ts, -dur)
        self.ts = [op.ts for op in self.ops]
        self.threads: list[tuple[int, int]] = []
        for i, op in enumerate(self.ops):
            if not self.threads or self.ops[self.threads[-1][0]].tid != op.tid:
                self.threads.append((i, i))
            self.threads[-1] = (self.threads[-1][0], i + 1)
        self.remap = _main_threads(host)
        self.queue = _queue_lengths(all_kernels)

    def cpu_in(self, a: float, b: float) -> list[HostOp]:
        """The operators and runtime calls starting in [a, b), in host order."""
        out: list[HostOp] = []
        for lo, hi in self.threads:
            out += self.ops[bisect_left(self.ts, a, lo, hi):bisect_left(self.ts, b, lo, hi)]
        return out


def critical_path_breakdown(host: Sequence[HostOp], kernels: Sequence[Kernel], all_kernels: Sequence[Kernel],
                            window: tuple[float, float], index: RankIndex | None = None) -> dict[str, float]:
    """Seconds of the step's critical path bound by each of BOUNDS (module docstring); `index`: the
    rank's RankIndex, when the caller summarizes several steps."""
    a, b = window
    index = index or RankIndex(host, all_kernels)
    cpu = index.cpu_in(a, b)
    runtime_of = {(op.tid, op.ts): i for i, op in enumerate(cpu) if op.cat in RUNTIME_CATS}
    gpu = sorted((k for k in kernels if (k.launch.tid, k.launch.ts) in runtime_of), key=lambda k: k.ev.ts)
    g = _Graph([op.ts for op in cpu] + [k.ev.ts for k in gpu], [op.end for op in cpu] + [k.ev.end for k in gpu])
    _cpu_edges(g, cpu, index.remap)
    queue, last = index.queue, {}
    for j, k in enumerate(gpu):
        i = len(cpu) + j
        g.add(i, g.n + i, OP, i)
        rt = runtime_of[(k.launch.tid, k.launch.ts)]
        q_rt, q_k = queue.get(id(k), (0, 0))
        prev = last.get(k.ev.stream)
        if q_rt == 1 and q_k == 0 and (prev is None or g.times[prev] < cpu[rt].ts):
            g.add(rt, i, LAUNCH, i)
        elif prev is not None and k.ev.ts - g.times[prev] < KERNEL_KERNEL_DELAY_THRESHOLD_US:
            g.add(prev, i, KK, i)
        last[k.ev.stream] = g.n + i
    out = dict.fromkeys(BOUNDS, 0.0)
    for w, kind, ev in g.longest():
        if kind == LAUNCH:
            out["gpu_kernel_launch_overhead"] += w * 1e-6
        elif kind == KK:
            out["gpu_kernel_kernel_overhead"] += w * 1e-6
        elif kind == OP and ev < len(cpu):
            out["cpu_bound"] += w * 1e-6
        elif kind == OP:
            comm = category(gpu[ev - len(cpu)].cls) == "comm"
            out["gpu_communication_bound" if comm else "gpu_compute_bound"] += w * 1e-6
    return out
