# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The compiled event core: sim/engine/loop.py, processes.py and arbiter.py as one state machine over arrays.

The same engine as the Python reference, step for step (sim/engine/events.py states its rules):

- the heap orders entries by (time, priority, sequence number) and every push takes the next number, in the
  order the Python engine pushes (process starts URGENT, `succeed` and timeouts NORMAL);
- a signal keeps its callbacks in the order they were added (a waiting process, an all-of counter, the
  arbiter's timer); processing one marks it done, then calls them in order; waiting on a done signal
  continues at once;
- each generator of processes.py (a FIFO stream, a P2P batch, a P2P transfer) is a process with an explicit
  resume point (`phase`) that does, between two waits, exactly what the generator does between two yields;
- the arbiter drains jobs with the same float operations in the same order; its rates come from FairRates
  (_fair_rates.pxi, included below: fair_rates' steps as C loops over loads interned once per run, the same
  floats), which asks the reference (arbiter.MemoRates) only for loads outside its C loops; a Core given
  another rates function calls it, as the Python engine does;
- the collective coster is asked at the same points, except that one marked `by_value` (a pure, memoized
  coster that returns the same timing object for the same work and group) is asked once per (work object,
  group object) pair and its answer reused: the same object it would have returned; the answer is kept per
  stage under (the work's index in the stage's work table, the group's number: equal groups, one number);
- a rank's group of each kind is asked of group_of once and numbered by value (Core.coded_group): a
  rendezvous is keyed by (op id, or name for "embed", group number), which meets exactly where the
  reference's (op id or name, group) key meets.

Every float is an IEEE double computed by the same operation as in Python (`a + b`, `a - b`, `a * b`,
`a / b`, and max/min written as Python's builtins pick: the first argument unless a later one is strictly
greater / smaller); the module is compiled with -O2 -ffp-contract=off and no fast-math (setup.py), so no
operation is fused or reordered. tests/test_engine_compiled.py checks it event for event against the
Python core on generated inputs and on library scenarios.

Inputs are arrays per pipeline stage (sim/engine/compiled.py builds them): op kind, dependency lists in CSR
form, host issue times per op; the costers (compute_s, collective, p2p) and the rates function are Python
callables, called at the same points, with the same arguments, as the Python engine calls them.
"""

from cpython.long cimport PyLong_FromVoidPtr
from libc.stdlib cimport free, malloc, realloc

import numpy as np

cdef enum:
    URGENT = 0
    NORMAL = 1

cdef enum:
    CB_RESUME = 0
    CB_ALLOF = 1
    CB_TICK = 2

cdef enum:
    K_COMPUTE = 0
    K_COLLECTIVE = 1
    K_P2P = 2

# resume points of a stream process
cdef enum:
    S_NEXT = 0
    S_DEPS = 1
    S_ISSUE = 2
    S_HOST = 3
    S_ISSUE_WAIT = 4
    S_START = 5
    S_XFER = 6
    S_XFER_BW = 7
    S_XFER_DONE = 8
    S_RV_WAITED = 9
    S_COMPUTE_DONE = 10
    S_END = 11

ctypedef struct Entry:
    double t
    int prio
    long long seq
    int sig

ctypedef struct Sig:
    int done
    int head
    int tail

ctypedef struct Node:
    int kind
    int arg
    int next

cdef double _EPS_S = 1e-15


cdef inline bint _less(Entry* a, Entry* b) noexcept nogil:
    """(time, priority, sequence) lexicographically, as Python compares the heap's tuples."""
    if a.t != b.t:
        return a.t < b.t
    if a.prio != b.prio:
        return a.prio < b.prio
    return a.seq < b.seq


cdef void* _grow(void* ptr, Py_ssize_t* cap, Py_ssize_t need, size_t size) except NULL:
    cdef Py_ssize_t new_cap = cap[0]
    if need <= new_cap and ptr != NULL:
        return ptr
    if new_cap < 16:
        new_cap = 16
    while new_cap < need:
        new_cap *= 2
    cdef void* out = realloc(ptr, new_cap * size)
    if out == NULL:
        raise MemoryError()
    cap[0] = new_cap
    return out


cdef class Stage:
    """One pipeline stage's schedule as arrays (sim/engine/compiled.py)."""
    cdef public object ops          # the Op records, by index (a sequence: read only off the hot path)
    cdef public tuple works         # the stage's distinct work objects (op k's: works[work_ix[k]])
    cdef public list streams        # per FIFO stream with ops: its op indices in order (int arrays)
    cdef public list batches        # op indices of the pp_comm stream, in order
    cdef public object kind_arr, dep_ptr_arr, dep_idx_arr, issue_arr, point_arr, awaited_arr, base_arr
    cdef int[::1] kind
    cdef int[::1] dep_ptr
    cdef int[::1] dep_idx
    cdef double[::1] issue          # host issue time per op index (len 0: none)
    cdef int[::1] point_of          # index of the last host sync at or before the op (-1: none); len 0: no syncs
    cdef int[::1] awaited           # per sync: the op index it waits for
    cdef double[::1] base_s         # per sync: the static clock when it starts waiting
    cdef double[::1] dur            # compute ops: their time, priced once per work (len 0: ask compute_s per op)
    cdef bint priced
    cdef public object dur_arr
    cdef public int stage            # its index (the arbiter key of a collective's copies: (stage, op id))
    cdef public object op_ids       # per op index: its id (a range where ids are positions)
    cdef bint dense_ids             # op ids are the positions 0, 1, ... (every built schedule)
    cdef public object gcode_arr, work_ix_arr
    cdef int[::1] gcode             # per op: its collective's group kind, as a code into Core.kinds (-1: none)
    cdef int[::1] work_ix           # per op: its work's index in the stage's work table (one per work object)
    cdef Py_ssize_t n_works
    cdef dict timing                # gid * n_works + work index -> the by_value coster's timing (Core.collective_timing)
    cdef public list sizes          # per op: (bytes, flops) of its work (events.work_bytes, Op.flops)

    def set_arrays(self, kind, dep_ptr, dep_idx, issue, point_of, awaited, base_s, durations):
        self.kind_arr, self.dep_ptr_arr, self.dep_idx_arr = kind, dep_ptr, dep_idx
        self.issue_arr, self.point_arr, self.awaited_arr, self.base_arr = issue, point_of, awaited, base_s
        self.kind, self.dep_ptr, self.dep_idx = kind, dep_ptr, dep_idx
        self.issue, self.point_of, self.awaited, self.base_s = issue, point_of, awaited, base_s
        self.dur_arr, self.dur = durations, durations
        self.priced = durations.shape[0] > 0

    def set_groups(self, gcode, work_ix, Py_ssize_t n_works):
        """Per op its group-kind code (-1: not a collective) and its work's index among the n_works distinct
        work objects of the stage (compiled.py)."""
        self.gcode_arr, self.work_ix_arr = gcode, work_ix
        self.gcode, self.work_ix, self.n_works = gcode, work_ix, n_works
        self.timing = {}

    cdef inline object oid(self, int k):
        """Op k's id."""
        if self.dense_ids:
            return k
        return self.op_ids[k]

    cdef inline long long oid_c(self, int k) except? -1:
        if self.dense_ids:
            return k
        return self.op_ids[k]


cdef class Proc:
    cdef int pid
    cdef int kind          # 0 stream, 1 P2P batch, 2 P2P transfer
    cdef int ri
    cdef Stage stage
    cdef int phase
    cdef int[::1] ops      # stream: its op indices
    cdef Py_ssize_t pos
    cdef int op            # the current op index
    cdef int dep           # next position in the op's dependency list
    cdef double at_s
    cdef double start_s
    cdef object group
    cdef long long gid
    cdef int members
    cdef _Rendezvous rv
    cdef object rv_key
    cdef double bw_s
    cdef object load
    cdef list posts
    cdef _Posted posted
    cdef object key
    cdef object nbytes


cdef class _Rendezvous:
    cdef int expected
    cdef int arrived
    cdef long long last
    cdef double last_s
    cdef double start_s
    cdef long long last_op
    cdef int done


cdef class _Posted:
    cdef int done
    cdef long long rank
    cdef long long op_id
    cdef double posted_s
    cdef double start_s
    cdef long long last
    cdef long long last_op


cdef class _KeyCount:
    cdef int n                        # the jobs draining under one key (Core.jobs_of_key)


cdef class _Job:
    cdef object key
    cdef _KeyCount kc                 # its key's count in Core.jobs_of_key
    cdef long long tag0, tag1         # its tag (tag0, tag1) when `tag` is None
    cdef double remaining_s
    cdef object load
    cdef int done
    cdef object own
    cdef double rate
    cdef object tag
    cdef double start_s
    cdef Py_ssize_t li                # its load's index in the Core's FairRates (-1: the rates function is another)


cdef struct JobRow:
    long long tag0, tag1, key0, key1  # a job's tag and key when both are pairs of ints (else Core.job_odd)
    double start_s, end_s


cdef inline bint _int_pair(object x):
    return type(x) is tuple and len(<tuple>x) == 2 and type((<tuple>x)[0]) is int and type((<tuple>x)[1]) is int


include "_fair_fill.pxi"
include "_fair_rates.pxi"


cdef class Core:
    """One run: the loop, the processes' shared state, the arbiter."""
    # the loop
    cdef public double now
    cdef Entry* heap
    cdef Py_ssize_t heap_n, heap_cap
    cdef long long seq
    cdef Sig* sigs
    cdef Py_ssize_t sig_n, sig_cap
    cdef Node* nodes
    cdef Py_ssize_t node_n, node_cap
    cdef int* allof_left
    cdef int* allof_sig
    cdef Py_ssize_t allof_n, allof_cap
    cdef list procs
    # the run
    cdef list stages            # Stage per stage
    cdef list rank_stage        # per rank index: its Stage
    cdef long long[::1] ranks
    cdef object rank_set
    cdef object compute_s, collective, p2p, group_of
    cdef bint coll_by_value           # collective.by_value: one timing per (work, group) (module docstring)
    cdef dict coll_memo               # (id(work), id(group)) -> (work, group, timing) when coll_by_value
    cdef list kinds                   # the collectives' group kinds, by code (Stage.gcode)
    cdef int embed_code               # the code of "embed" (-1: no collective spans stages)
    cdef Py_ssize_t n_kinds
    cdef list rank_groups             # [ri * n_kinds + code]: (group, members in the run, gid), None until asked
    cdef dict gid_of                  # a group's value -> its number (equal groups, one number)
    cdef list comm_loads              # per gid: comm_load(group) (None until asked)
    cdef double kappa
    cdef int* offset            # per rank index: where its ops start in the per-(rank, op) arrays
    cdef char* done
    cdef double* end_s
    cdef int* waiters
    cdef char* has_issue
    cdef char* has_syncs
    cdef list delays
    cdef list cpu_load
    cdef dict comm_cpu, open, groups, posted
    cdef public list transfers
    # the event log, one row per finished op in completion order (rows [0, rec_n) written; sized for every op)
    cdef Py_ssize_t rec_n
    cdef object rec_ri_arr, rec_op_arr, rec_start_arr, rec_end_arr, rec_wait_arr, rec_peer_arr, rec_peer_op_arr
    cdef int[::1] rec_ri, rec_op
    cdef double[::1] rec_start, rec_end, rec_wait
    cdef long long[::1] rec_peer, rec_peer_op
    cdef object transfer_type
    # the arbiter
    cdef object rates
    cdef dict rate_memo          # MemoRates._memo: ids of the loads -> (the loads, their rates)
    cdef FairRates fair          # rates is a FairRates: asked in C over interned loads (None: rates is called)
    cdef list jobs
    cdef double last_s
    cdef int timer
    cdef dict merged, jobs_of_key
    cdef int owning
    # every finished job as a row (rows [0, job_n) written), its loads by reference; job_rows() reads them
    cdef JobRow* job_rows_
    cdef Py_ssize_t job_n, job_cap
    cdef public list job_loads, job_owns
    cdef public dict job_odd          # row -> (tag, key) of a job whose tag or key is not a pair of ints

    def __dealloc__(self):
        free(self.heap)
        free(self.sigs)
        free(self.nodes)
        free(self.allof_left)
        free(self.allof_sig)
        free(self.offset)
        free(self.done)
        free(self.end_s)
        free(self.waiters)
        free(self.has_issue)
        free(self.has_syncs)
        free(self.job_rows_)

    def __init__(self, stages, rank_stage_index, ranks, issue_ranks, sync_ranks, compute_s, collective, p2p,
                 group_of, double kappa, rates, transfer_type, kinds):
        cdef Py_ssize_t n_ranks = len(ranks), ri, total = 0
        cdef Stage st
        self.stages = list(stages)
        self.rank_stage = [self.stages[i] for i in rank_stage_index]
        self.ranks = np.asarray(ranks, dtype=np.int64)
        self.rank_set = frozenset(ranks)
        self.compute_s, self.collective, self.p2p, self.group_of = compute_s, collective, p2p, group_of
        self.coll_by_value = getattr(collective, "by_value", False) is True
        self.coll_memo = {}
        self.kinds = list(kinds)
        self.n_kinds = len(self.kinds)
        self.embed_code = self.kinds.index("embed") if "embed" in self.kinds else -1
        self.rank_groups = [None] * (n_ranks * self.n_kinds)
        self.gid_of, self.comm_loads = {}, []
        for st in self.stages:
            ids = st.op_ids
            st.dense_ids = ids == range(len(st.ops)) if type(ids) is range else False
            if st.gcode_arr is None:
                raise ValueError("a Stage without set_groups")
        self.kappa = kappa
        self.offset = <int*>malloc((n_ranks + 1) * sizeof(int))
        self.has_issue = <char*>malloc((n_ranks + 1) * sizeof(char))
        self.has_syncs = <char*>malloc((n_ranks + 1) * sizeof(char))
        if self.offset == NULL or self.has_issue == NULL or self.has_syncs == NULL:
            raise MemoryError()
        for ri in range(n_ranks):
            st = self.rank_stage[ri]
            self.offset[ri] = total
            total += len(st.ops)
            self.has_issue[ri] = ranks[ri] in issue_ranks
            self.has_syncs[ri] = ranks[ri] in sync_ranks
        self.offset[n_ranks] = total
        self.done = <char*>malloc((total + 1) * sizeof(char))
        self.end_s = <double*>malloc((total + 1) * sizeof(double))
        self.waiters = <int*>malloc((total + 1) * sizeof(int))
        if self.done == NULL or self.end_s == NULL or self.waiters == NULL:
            raise MemoryError()
        for ri in range(total):
            self.done[ri] = 0
            self.end_s[ri] = 0.0
            self.waiters[ri] = -1
        self.rec_n = 0
        self.rec_ri_arr, self.rec_op_arr = np.empty(total, np.intc), np.empty(total, np.intc)
        self.rec_start_arr, self.rec_end_arr = np.empty(total, np.float64), np.empty(total, np.float64)
        self.rec_wait_arr = np.empty(total, np.float64)
        self.rec_peer_arr, self.rec_peer_op_arr = np.empty(total, np.int64), np.empty(total, np.int64)
        self.rec_ri, self.rec_op = self.rec_ri_arr, self.rec_op_arr
        self.rec_start, self.rec_end, self.rec_wait = self.rec_start_arr, self.rec_end_arr, self.rec_wait_arr
        self.rec_peer, self.rec_peer_op = self.rec_peer_arr, self.rec_peer_op_arr
        self.delays = [[] for _ in range(n_ranks)]
        self.cpu_load = [{("cpu", r): 1.0} for r in ranks]
        self.comm_cpu, self.open, self.groups, self.posted = {}, {}, {}, {}
        self.transfers = []
        self.transfer_type = transfer_type
        self.procs = []
        self.now = 0.0
        self.seq = 0
        self.rates = rates
        self.fair = rates if type(rates) is FairRates else None
        memo = getattr(rates, "_memo", None)  # arbiter.MemoRates (rates_of); any other rates function: called
        self.rate_memo = memo if type(memo) is dict else None
        self.jobs = []
        self.last_s = 0.0
        self.timer = -1
        self.merged, self.jobs_of_key = {}, {}
        self.owning = 0
        self.job_n = 0
        self.job_loads, self.job_owns, self.job_odd = [], [], {}

    # ----- the loop ------------------------------------------------------------------------------------
    cdef int new_sig(self) except -1:
        if self.sig_n >= self.sig_cap:
            self.sigs = <Sig*>_grow(self.sigs, &self.sig_cap, self.sig_n + 1, sizeof(Sig))
        cdef int s = <int>self.sig_n
        self.sigs[s].done = 0
        self.sigs[s].head = -1
        self.sigs[s].tail = -1
        self.sig_n += 1
        return s

    cdef int add_cb(self, int sig, int kind, int arg) except -1:
        if self.node_n >= self.node_cap:
            self.nodes = <Node*>_grow(self.nodes, &self.node_cap, self.node_n + 1, sizeof(Node))
        cdef int n = <int>self.node_n
        self.node_n += 1
        self.nodes[n].kind = kind
        self.nodes[n].arg = arg
        self.nodes[n].next = -1
        if self.sigs[sig].tail == -1:
            self.sigs[sig].head = n
        else:
            self.nodes[self.sigs[sig].tail].next = n
        self.sigs[sig].tail = n
        return 0

    cdef int push(self, double t, int prio, int sig) except -1:
        if self.heap_n >= self.heap_cap:
            self.heap = <Entry*>_grow(self.heap, &self.heap_cap, self.heap_n + 1, sizeof(Entry))
        cdef Py_ssize_t i = self.heap_n, parent
        cdef Entry e
        e.t, e.prio, e.seq, e.sig = t, prio, self.seq, sig
        self.seq += 1
        self.heap_n += 1
        while i > 0:
            parent = (i - 1) >> 1
            if _less(&e, &self.heap[parent]):
                self.heap[i] = self.heap[parent]
                i = parent
            else:
                break
        self.heap[i] = e
        return 0

    cdef Entry pop(self) noexcept:
        cdef Entry top = self.heap[0]
        cdef Entry last
        cdef Py_ssize_t i = 0, child, n
        self.heap_n -= 1
        n = self.heap_n
        if n > 0:
            last = self.heap[n]
            while True:
                child = 2 * i + 1
                if child >= n:
                    break
                if child + 1 < n and _less(&self.heap[child + 1], &self.heap[child]):
                    child += 1
                if _less(&self.heap[child], &last):
                    self.heap[i] = self.heap[child]
                    i = child
                else:
                    break
            self.heap[i] = last
        return top

    cdef int succeed(self, int sig) except -1:
        return self.push(self.now, NORMAL, sig)

    cdef int timeout(self, double delay_s) except -1:
        if delay_s < 0:
            raise ValueError(f"negative delay {delay_s}")
        cdef int s = self.new_sig()
        self.push(self.now + delay_s, NORMAL, s)
        return s

    cdef int start(self, Proc p) except -1:
        p.pid = len(self.procs)
        self.procs.append(p)
        cdef int s = self.new_sig()
        self.add_cb(s, CB_RESUME, p.pid)
        self.push(self.now, URGENT, s)
        return 0

    cdef bint wait(self, int sig, Proc p) except -1:
        """True: `p` now waits for `sig`; False: `sig` is processed, go on at once."""
        if self.sigs[sig].done:
            return False
        self.add_cb(sig, CB_RESUME, p.pid)
        return True

    cdef int all_of(self, list sigs) except -1:
        cdef int done = self.new_sig(), a, s
        if not sigs:
            self.succeed(done)
            return done
        self.allof_left = <int*>_grow(self.allof_left, &self.allof_cap, self.allof_n + 1, sizeof(int))
        self.allof_sig = <int*>realloc(self.allof_sig, self.allof_cap * sizeof(int))
        if self.allof_sig == NULL:
            raise MemoryError()
        a = <int>self.allof_n
        self.allof_n += 1
        self.allof_left[a] = len(sigs)
        self.allof_sig[a] = done
        for s in sigs:
            if self.sigs[s].done:
                self.allof_check(a)
            else:
                self.add_cb(s, CB_ALLOF, a)
        return done

    cdef int allof_check(self, int a) except -1:
        self.allof_left[a] -= 1
        if self.allof_left[a] == 0:
            self.succeed(self.allof_sig[a])
        return 0

    def run(self):
        """Start the processes in (rank, stream) order and process events until none is left."""
        if self.waiters == NULL:
            raise RuntimeError("a Core runs once")
        cdef Py_ssize_t ri
        cdef Stage st
        cdef Proc p
        cdef Entry e
        cdef int node, kind, arg
        for ri in range(len(self.ranks)):
            st = self.rank_stage[ri]
            for ops in st.streams:
                p = Proc()
                p.kind, p.ri, p.stage, p.ops, p.pos, p.phase = 0, <int>ri, st, ops, 0, S_NEXT
                self.start(p)
            for op in st.batches:
                p = Proc()
                p.kind, p.ri, p.stage, p.op, p.phase = 1, <int>ri, st, op, 0
                self.start(p)
        while self.heap_n:
            e = self.pop()
            self.now = e.t
            self.sigs[e.sig].done = 1
            node = self.sigs[e.sig].head
            while node != -1:
                kind = self.nodes[node].kind
                arg = self.nodes[node].arg
                if kind == CB_RESUME:
                    self.resume(<Proc>self.procs[arg])
                elif kind == CB_ALLOF:
                    self.allof_check(arg)
                else:
                    self.tick(e.sig)
                node = self.nodes[node].next
        self.release()

    cdef int release(self) except -1:
        """Free what only the loop reads (the heap, signals, callbacks, all-of counters, waiters, the
        processes and memos) once it has run: the log, the jobs and `done` stay."""
        free(self.heap)
        free(self.sigs)
        free(self.nodes)
        free(self.allof_left)
        free(self.allof_sig)
        free(self.waiters)
        self.heap = NULL
        self.sigs = NULL
        self.nodes = NULL
        self.allof_left = NULL
        self.allof_sig = NULL
        self.waiters = NULL
        self.heap_cap = self.sig_cap = self.node_cap = self.allof_cap = 0
        self.sig_n = self.node_n = self.allof_n = 0
        self.procs = []
        self.coll_memo, self.open, self.posted, self.merged, self.jobs_of_key = {}, {}, {}, {}, {}
        self.rank_groups = [None] * len(self.rank_groups)
        self.comm_loads = [None] * len(self.comm_loads)
        cdef Stage st
        for st in self.stages:
            st.timing = {}
        return 0

    cdef int resume(self, Proc p) except -1:
        if p.kind == 0:
            return self.step_stream(p)
        if p.kind == 1:
            return self.step_batch(p)
        return self.step_transfer(p)

    # ----- the processes (processes.py) ----------------------------------------------------------------
    cdef int waiter(self, int ri, int op) except -1:
        cdef int at = self.offset[ri] + op
        cdef int s = self.waiters[at]
        if s == -1:
            s = self.new_sig()
            self.waiters[at] = s
        return s

    cdef int finish(self, int ri, int op, double start_s, double wait_s, long long peer, long long peer_op) except -1:
        cdef int at = self.offset[ri] + op
        cdef int s
        self.done[at] = 1
        self.end_s[at] = self.now
        s = self.waiters[at]
        if s != -1:
            self.waiters[at] = -1
            self.succeed(s)
        cdef Py_ssize_t k = self.rec_n  # < the number of (rank, op) pairs: each op finishes once per rank
        if k >= self.rec_ri.shape[0]:
            raise RuntimeError("an op finished twice")
        self.rec_ri[k], self.rec_op[k], self.rec_start[k], self.rec_end[k] = ri, op, start_s, self.now
        self.rec_wait[k], self.rec_peer[k], self.rec_peer_op[k] = wait_s, peer, peer_op
        self.rec_n += 1
        return 0

    cdef bint wait_deps(self, Proc p) except -1:
        """Wait for the op's deps in order (True: waiting now)."""
        cdef Stage st = p.stage
        cdef int end = st.dep_ptr[p.op + 1], d
        cdef int base = self.offset[p.ri]
        while p.dep < end:
            d = st.dep_idx[p.dep]
            p.dep += 1
            if not self.done[base + d]:
                if self.wait(self.waiter(p.ri, d), p):
                    return True
        return False

    cdef tuple group(self, object kind, long long rank):
        key = (kind, rank)
        hit = self.groups.get(key)
        if hit is None:
            group = self.group_of(kind, rank)
            hit = self.groups[key] = (group, sum(1 for r in group if r in self.rank_set))
        return <tuple>hit

    cdef object collective_timing(self, Stage st, int k, object group, long long gid):
        """collective(op k of `st`, group); a coster that says `by_value` (its timing depends only on the op's
        work and the group, and is the same object each time: sim/results/costers.py CollectiveCoster) is asked
        once per (work, group) object pair, both kept alive by the memo so their ids stay theirs: the op's
        record is read only on a miss."""
        cdef long long slot
        if not self.coll_by_value:
            return self.collective(st.ops[k], group)
        slot = gid * st.n_works + st.work_ix[k]  # (this work object, a group of this value)
        hit = st.timing.get(slot)
        if hit is not None:
            return hit
        work = st.works[st.work_ix[k]]
        key = (PyLong_FromVoidPtr(<void*>work), PyLong_FromVoidPtr(<void*>group))
        hit = self.coll_memo.get(key)
        if hit is None:
            hit = self.coll_memo[key] = (work, group, self.collective(st.ops[k], group))
        timing = st.timing[slot] = (<tuple>hit)[2]
        return timing

    cdef tuple coded_group(self, int ri, int code):
        """group(kind, rank) for the kind of that code, with the group's number (gid: equal groups, equal
        numbers), kept per (rank, kind)."""
        cdef Py_ssize_t at = ri * self.n_kinds + code
        hit = self.rank_groups[at]
        if hit is None:
            group, members = self.group(self.kinds[code], self.ranks[ri])
            gid = self.gid_of.get(group)
            if gid is None:
                gid = self.gid_of[group] = len(self.gid_of)
                self.comm_loads.append(None)
            hit = self.rank_groups[at] = (group, members, gid)
        return <tuple>hit

    cdef object copy_key(self, Stage st, Proc p):
        """processes.copy_key: (stage, op id), or ("embed", name) for a collective spanning stages."""
        if st.gcode[p.op] == self.embed_code:
            return ("embed", st.ops[p.op].name)
        return (st.stage, st.oid(p.op))

    cdef object comm_load(self, object group, long long gid):
        if self.kappa <= 0:
            return None
        load = self.comm_loads[gid]
        if load is not None:
            return load
        load = self.comm_cpu.get(group)
        if load is None:
            load = self.comm_cpu[group] = {("cpu", r): self.kappa for r in group if r in self.rank_set}
        self.comm_loads[gid] = load
        return load

    cdef int step_stream(self, Proc p) except -1:
        cdef Stage st = p.stage
        cdef long long rank = self.ranks[p.ri]
        cdef double dur_s, lat_s, prev_s, cand_s
        cdef int point, i, awaited, base = self.offset[p.ri], s
        cdef list known
        cdef _Rendezvous rv
        while True:
            if p.phase == S_NEXT:
                if p.pos >= p.ops.shape[0]:
                    p.phase = S_END
                    return 0
                p.op = p.ops[p.pos]
                p.dep = st.dep_ptr[p.op]
                p.phase = S_DEPS
            if p.phase == S_DEPS:
                if self.wait_deps(p):
                    return 0
                p.phase = S_ISSUE
            if p.phase == S_ISSUE:
                if self.has_issue[p.ri]:
                    p.at_s = st.issue[p.op]
                    if self.has_syncs[p.ri] and st.point_of[p.op] >= 0:
                        p.phase = S_HOST
                    else:
                        p.phase = S_ISSUE_WAIT
                else:
                    p.phase = S_START
            if p.phase == S_HOST:  # processes.host_delay
                point = st.point_of[p.op]
                known = <list>self.delays[p.ri]
                while len(known) <= point:
                    i = len(known)
                    awaited = st.awaited[i]
                    if not self.done[base + awaited]:
                        if self.wait(self.waiter(p.ri, awaited), p):
                            return 0
                        continue
                    prev_s = <double>known[i - 1] if i else 0.0
                    cand_s = self.end_s[base + awaited] - st.base_s[i]
                    known.append(cand_s if cand_s > prev_s else prev_s)  # host.next_delay_s: max(prev, cand)
                p.at_s = p.at_s + <double>known[point]
                p.phase = S_ISSUE_WAIT
            if p.phase == S_ISSUE_WAIT:
                p.phase = S_START
                if p.at_s > self.now:
                    if self.wait(self.timeout(p.at_s - self.now), p):
                        return 0
            if p.phase == S_START:
                p.start_s = self.now
                if st.kind[p.op] == K_COLLECTIVE:
                    p.group, p.members, p.gid = self.coded_group(p.ri, st.gcode[p.op])
                    if p.members == 1:
                        p.rv = None
                        p.phase = S_XFER
                    else:  # processes.rendezvous
                        # stages number ops apart: a collective spanning stages is known by its name
                        key = (st.ops[p.op].name if st.gcode[p.op] == self.embed_code else st.oid(p.op), p.gid)
                        rv = self.open.get(key)
                        if rv is None:
                            rv = _Rendezvous()
                            rv.expected, rv.arrived, rv.last, rv.last_s, rv.last_op = p.members, 0, -1, -1.0, -1
                            rv.start_s = 0.0
                            rv.done = self.new_sig()
                            self.open[key] = rv
                        rv.arrived += 1
                        if self.now > rv.last_s or rank > rv.last:  # the member that issued last; ties: higher rank
                            rv.last, rv.last_op, rv.last_s = rank, st.oid_c(p.op), self.now
                        p.rv, p.rv_key = rv, key
                        if rv.arrived < rv.expected:
                            p.phase = S_RV_WAITED
                            if self.wait(rv.done, p):
                                return 0
                        else:
                            rv.start_s = self.now
                            p.phase = S_XFER
                else:
                    dur_s = st.dur[p.op] if st.priced else self.compute_s(st.ops[p.op], rank)
                    p.phase = S_COMPUTE_DONE
                    if dur_s > 0:
                        if self.kappa > 0:
                            s = self.drain(("compute", rank), dur_s, self.cpu_load[p.ri], None,
                                           None if st.dense_ids else (rank, st.oid(p.op)), rank, p.op)
                        else:
                            s = self.timeout(dur_s)
                        if self.wait(s, p):
                            return 0
            if p.phase == S_XFER:  # processes.transfer
                lat_s, p.bw_s, p.load = self.collective_timing(st, p.op, p.group, p.gid)
                p.phase = S_XFER_BW
                if lat_s > 0:
                    if self.wait(self.timeout(lat_s), p):
                        return 0
            if p.phase == S_XFER_BW:
                p.phase = S_XFER_DONE
                if p.bw_s > 0:
                    s = self.drain(self.copy_key(st, p), p.bw_s, p.load, self.comm_load(p.group, p.gid),
                                   None if st.dense_ids else (rank, st.oid(p.op)), rank, p.op)
                    if self.wait(s, p):
                        return 0
            if p.phase == S_XFER_DONE:
                p.load = None
                if p.rv is None:
                    self.finish(p.ri, p.op, p.start_s, 0.0, rank, -1)
                else:
                    rv = p.rv
                    del self.open[p.rv_key]
                    self.succeed(rv.done)
                    self.finish(p.ri, p.op, p.start_s, rv.start_s - p.start_s, rv.last, rv.last_op)
                p.pos += 1
                p.phase = S_NEXT
                p.rv = None
                continue
            if p.phase == S_RV_WAITED:
                rv = p.rv
                self.finish(p.ri, p.op, p.start_s, rv.start_s - p.start_s, rv.last, rv.last_op)
                p.pos += 1
                p.phase = S_NEXT
                p.rv = None
                continue
            if p.phase == S_COMPUTE_DONE:
                self.finish(p.ri, p.op, p.start_s, 0.0, -1, -1)
                p.pos += 1
                p.phase = S_NEXT
                continue

    cdef int step_batch(self, Proc p) except -1:
        """processes.p2p_batch: deps, post every transfer, end when the last one ends."""
        cdef Stage st = p.stage
        cdef _Posted best, q
        cdef Py_ssize_t k
        if p.phase == 0:
            p.dep = st.dep_ptr[p.op]
            p.phase = 1
        if p.phase == 1:
            if self.wait_deps(p):
                return 0
            p.start_s = self.now
            p.posts = [self.post(p, t) for t in st.works[st.work_ix[p.op]].transfers]
            p.phase = 2
            if self.wait(self.all_of([(<_Posted>q).done for q in p.posts]), p):
                return 0
        if p.phase == 2:
            best = <_Posted>p.posts[0]
            for k in range(1, len(p.posts)):
                q = <_Posted>p.posts[k]
                if q.start_s > best.start_s or (q.start_s == best.start_s and q.last > best.last):
                    best = q
            p.posts = None
            p.phase = 3
            self.finish(p.ri, p.op, p.start_s, best.start_s - p.start_s, best.last, best.last_op)
        return 0

    cdef _Posted post(self, Proc p, object t):
        """processes.post: the second end to post runs the transfer."""
        cdef long long rank = self.ranks[p.ri]
        cdef Stage st = p.stage
        cdef _Posted mine
        cdef Proc x
        other = self.group("pp", rank)[0][t.peer_stage]
        if other not in self.rank_set:
            op = st.ops[p.op]
            raise ValueError(f"op {op.id} ({op.name}) on rank {rank}: P2P peer rank {other} is not simulated")
        if t.send:
            key = (rank, other, t.direction, t.micro_batch, t.sender_vstage)
        else:
            key = (other, rank, t.direction, t.micro_batch, t.sender_vstage)
        mine = self.posted.pop(key, None)
        if mine is None:
            mine = _Posted()
            mine.done, mine.rank, mine.op_id, mine.posted_s = self.new_sig(), rank, st.oid_c(p.op), self.now
            mine.start_s, mine.last, mine.last_op = 0.0, -1, -1
            self.posted[key] = mine
            return mine
        mine.start_s = self.now
        if self.now > mine.posted_s or rank > mine.rank:  # the end that posted last; ties: the higher rank
            mine.last, mine.last_op = rank, st.oid_c(p.op)
        else:
            mine.last, mine.last_op = mine.rank, mine.op_id
        x = Proc()
        x.kind, x.ri, x.stage, x.phase, x.posted, x.key, x.nbytes = 2, p.ri, st, 0, mine, key, t.nbytes
        self.start(x)
        return mine

    cdef int step_transfer(self, Proc p) except -1:
        """processes.transfer_p2p: latency, then bandwidth through the arbiter."""
        cdef double lat_s
        cdef int s
        key = p.key
        if p.phase == 0:
            lat_s, p.bw_s, p.load = self.p2p(key[0], key[1], p.nbytes)
            p.phase = 1
            if lat_s > 0:
                if self.wait(self.timeout(lat_s), p):
                    return 0
        if p.phase == 1:
            p.phase = 2
            if p.bw_s > 0:
                s = self.drain(("p2p", key[2], key[3], key[4]), p.bw_s, p.load, None, key)
                if self.wait(s, p):
                    return 0
        if p.phase == 2:
            p.phase = 3
            p.load = None
            self.transfers.append(self.transfer_type(key[0], key[1], key[2], key[3], key[4], p.posted.start_s,
                                                     self.now))
            self.succeed(p.posted.done)
        return 0

    # ----- the arbiter (arbiter.py) --------------------------------------------------------------------
    cdef int drain(self, object key, double work_s, object load, object own, object tag, long long tag0=0,
                   long long tag1=0) except -1:
        """A job under `key`; its tag is `tag`, or the int pair (tag0, tag1) when `tag` is None."""
        self.advance()
        cdef _Job job = _Job.__new__(_Job)
        cdef _KeyCount kc
        job.key, job.remaining_s, job.load, job.done, job.own = key, work_s, load, self.new_sig(), own
        job.rate, job.tag, job.start_s = 1.0, tag, self.now
        job.tag0, job.tag1 = tag0, tag1
        job.li = self.fair.intern(load) if self.fair is not None else -1
        self.jobs.append(job)
        hit = self.jobs_of_key.get(key)
        if hit is None:
            kc = _KeyCount.__new__(_KeyCount)
            self.jobs_of_key[key] = kc
        else:
            kc = <_KeyCount>hit
        kc.n += 1
        job.kc = kc
        if own:
            self.owning += 1
        self.reschedule()
        return job.done

    cdef int advance(self) except -1:
        cdef double dt = self.now - self.last_s
        cdef _Job job
        if dt > 0:
            for job in self.jobs:
                job.remaining_s = job.remaining_s - job.rate * dt
        self.last_s = self.now
        return 0

    cdef int reschedule(self) except -1:
        cdef list jobs = self.jobs
        cdef _Job job
        cdef double wait_s, x
        cdef Py_ssize_t k, n = len(jobs)
        if n == 1:
            job = <_Job>jobs[0]
            job.rate = 1.0
            x = job.remaining_s / job.rate
            wait_s = x if x > 0.0 else 0.0
        else:
            if not self.owning and len(self.jobs_of_key) == n:  # one job per key: its own load
                if self.fair is not None:
                    rates = self.fair_rates_of(jobs)
                else:
                    rates = self.rates_of([(<_Job>j).load for j in jobs])
                if len(rates) != n:
                    raise ValueError("rates of a different length than the jobs")
                for k in range(n):
                    (<_Job>jobs[k]).rate = rates[k]
            else:
                keys = self.key_loads()
                loads = list(keys.values())
                rate_of = dict(zip(keys, self.rates_of(loads) if self.fair is None else self.fair(loads),
                                   strict=True))
                for job in jobs:
                    job.rate = rate_of[job.key]
            job = <_Job>jobs[0]
            wait_s = job.remaining_s / job.rate
            for k in range(1, n):
                job = <_Job>jobs[k]
                x = job.remaining_s / job.rate
                if x < wait_s:
                    wait_s = x
            if not wait_s > 0.0:
                wait_s = 0.0
        self.timer = self.timeout(wait_s)
        self.add_cb(self.timer, CB_TICK, 0)
        return 0

    cdef object fair_rates_of(self, list jobs):
        """The jobs' rates from their interned loads (FairRates.rates_of), or the reference's for loads
        outside the C loops."""
        cdef FairRates fair = self.fair
        cdef Py_ssize_t k, n = len(jobs)
        fair.ix = <Py_ssize_t*>_grow(fair.ix, &fair.cap_ix, n + 1, sizeof(Py_ssize_t))
        for k in range(n):
            fair.ix[k] = (<_Job>jobs[k]).li
        rates = fair.rates_of(fair.ix, n)
        if rates is None:
            return fair.fallback([(<_Job>j).load for j in jobs])
        return rates

    cdef object rates_of(self, list loads):
        """self.rates(loads), answered from arbiter.MemoRates' own first table when it holds them (the lookup
        its __call__ makes, without the call), else by the call (which fills that table)."""
        if self.rate_memo is not None:
            hit = self.rate_memo.get(tuple([PyLong_FromVoidPtr(<void*>load) for load in loads]))
            if hit is not None:
                return (<tuple>hit)[1]
        return self.rates(loads)

    cdef dict key_loads(self):
        cdef dict keys = {}, owns = {}
        cdef _Job job
        for job in self.jobs:
            keys.setdefault(job.key, job.load)
            if job.own:
                owns.setdefault(job.key, []).append(job.own)
        for key, parts in owns.items():
            keys[key] = self.merge(keys[key], parts)
        return keys

    cdef object merge(self, object load, list owns):
        memo_key = (id(load), *map(id, owns))
        hit = self.merged.get(memo_key)
        if hit is None:
            merged = dict(load)
            for own in owns:
                merged.update(own)
            hit = self.merged[memo_key] = ([load, *owns], merged)
        return hit[1]

    cdef int record_job(self, _Job job) except -1:
        """One finished job as a row: (tag, key, start, end) in C, loads by reference (job_rows)."""
        cdef Py_ssize_t k = self.job_n
        if k >= self.job_cap:
            self.job_rows_ = <JobRow*>_grow(self.job_rows_, &self.job_cap, k + 1, sizeof(JobRow))
        cdef JobRow* row = &self.job_rows_[k]
        tag, key = job.tag, job.key
        row.tag0 = row.tag1 = row.key0 = row.key1 = 0
        if tag is None:  # the int pair (tag0, tag1)
            plain = _int_pair(key)
            if plain:
                try:
                    row.key0, row.key1 = key[0], key[1]
                except OverflowError:  # past 64 bits: kept as objects
                    plain = False
            if plain:
                row.tag0, row.tag1 = job.tag0, job.tag1
            else:
                self.job_odd[k] = ((job.tag0, job.tag1), key)
        else:
            plain = _int_pair(tag) and _int_pair(key)
            if plain:
                try:
                    row.tag0, row.tag1, row.key0, row.key1 = tag[0], tag[1], key[0], key[1]
                except OverflowError:  # past 64 bits: kept as objects
                    plain = False
            if not plain:
                self.job_odd[k] = (tag, key)
        row.start_s, row.end_s = job.start_s, self.now
        self.job_loads.append(job.load)
        self.job_owns.append(job.own)
        self.job_n = k + 1
        return 0

    def job_rows(self):
        """The finished jobs as columns, in finishing order: (tag0, tag1, key0, key1) int64, start_s, end_s
        float64, loads, owns (lists), odd (row -> (tag, key) where those are not pairs of ints)."""
        cdef Py_ssize_t n = self.job_n, k
        ints = [np.empty(n, np.int64) for _ in range(4)]
        times = [np.empty(n, np.float64) for _ in range(2)]
        cdef long long[::1] t0 = ints[0], t1 = ints[1], k0 = ints[2], k1 = ints[3]
        cdef double[::1] a = times[0], b = times[1]
        for k in range(n):
            t0[k], t1[k] = self.job_rows_[k].tag0, self.job_rows_[k].tag1
            k0[k], k1[k] = self.job_rows_[k].key0, self.job_rows_[k].key1
            a[k], b[k] = self.job_rows_[k].start_s, self.job_rows_[k].end_s
        return (*ints, *times, self.job_loads, self.job_owns, self.job_odd)

    cdef int forget(self, _Job job) except -1:
        job.kc.n -= 1
        if job.kc.n == 0:
            del self.jobs_of_key[job.key]
        if job.own:
            self.owning -= 1
        return 0

    cdef int tick(self, int timer) except -1:
        if timer != self.timer:  # superseded by a later start or finish
            return 0
        self.advance()
        cdef list jobs = self.jobs, finished = [], rest
        cdef _Job job, best
        cdef double cap, x, best_x
        for job in jobs:
            cap = job.rate if job.rate > 1.0 else 1.0
            if job.remaining_s <= _EPS_S * cap:
                finished.append(job)
        if not finished:  # round-off: the earliest job is a hair short; finish it now
            best = <_Job>jobs[0]
            best_x = best.remaining_s / best.rate
            for job in jobs[1:]:
                x = job.remaining_s / job.rate
                if x < best_x:
                    best, best_x = job, x
            finished.append(best)
        if len(finished) < len(jobs):
            rest = [job for job in jobs if not _contains(finished, job)]
        else:
            rest = []
        self.jobs = rest
        for job in finished:
            self.forget(job)
            self.record_job(job)
            self.succeed(job.done)
        if self.jobs:
            self.reschedule()
        return 0

    # ----- output --------------------------------------------------------------------------------------
    def columns(self):
        """The log's rows in completion order: (rank index (int32), op index in its stage (int32), start_s,
        end_s, wait_s (float64), peer, peer op (int64, -1: none)), each an array of the finished ops; and
        the latest end, as max() over them gives it (0.0 when none)."""
        cdef Py_ssize_t k, n = self.rec_n
        cdef double latest = 0.0
        for k in range(n):
            if k == 0 or self.rec_end[k] > latest:
                latest = self.rec_end[k]
        return (self.rec_ri_arr[:n], self.rec_op_arr[:n], self.rec_start_arr[:n], self.rec_end_arr[:n],
                self.rec_wait_arr[:n], self.rec_peer_arr[:n], self.rec_peer_op_arr[:n]), latest

    def finished_ids(self, Py_ssize_t ri):
        """The op ids rank index `ri` finished."""
        cdef Stage st = self.rank_stage[ri]
        cdef int base = self.offset[ri]
        return {st.op_ids[k] for k in range(len(st.ops)) if self.done[base + k]}


cdef inline bint _contains(list items, object x):
    for y in items:
        if y is x:
            return True
    return False


# ---- the arbiter's hot resources and components (sim/engine/fair_rates.py's numpy steps, as C loops) ----

cdef double _HOT_LIMIT = 1.0 + 1e-12  # fair_rates._HOT, the same double
cdef double* _sum_of = NULL       # per resource index: its summed load in the current call
cdef char* _seen_res = NULL       # per resource index: 1 while the current call has met it
cdef Py_ssize_t* _column_of = NULL  # per resource index: its column among the hot ones, -1 otherwise
cdef Py_ssize_t _res_cap = 0
cdef Py_ssize_t* _met = NULL      # the resources met by the current call, in order of first appearance
cdef Py_ssize_t _met_cap = 0


cdef int _fit_resources(Py_ssize_t need) except -1:
    """Grow the per-resource scratch to `need` entries (new entries unseen, no column)."""
    global _sum_of, _seen_res, _column_of, _res_cap
    cdef Py_ssize_t cap = _res_cap if _res_cap else 256, i
    while cap < need:
        cap *= 2
    cdef double* s = <double*>realloc(_sum_of, cap * sizeof(double))
    if s == NULL:
        raise MemoryError()
    _sum_of = s
    cdef char* m = <char*>realloc(_seen_res, cap * sizeof(char))
    if m == NULL:
        raise MemoryError()
    _seen_res = m
    cdef Py_ssize_t* c = <Py_ssize_t*>realloc(_column_of, cap * sizeof(Py_ssize_t))
    if c == NULL:
        raise MemoryError()
    _column_of = c
    for i in range(_res_cap, cap):
        _seen_res[i] = 0
        _column_of[i] = -1
    _res_cap = cap
    return 0


def hot_of_arrays(list arrays, numbers=None):
    """(hot resources in order of first appearance, per load whether it has one): fair_rates.hot_of_arrays.
    Given `numbers` (one per load), per load its number if it has a hot resource, else -1, instead.

    Each resource's load is summed from 0.0 in array order (load by load, entry by entry), the additions
    np.bincount makes over the concatenated arrays; hot means a sum > 1 + 1e-12, the same comparison."""
    global _met
    cdef Py_ssize_t n = len(arrays), j, k, r, met = 0
    cdef const Py_ssize_t[::1] idx
    cdef const double[::1] w
    for j in range(n):
        pair = <tuple>arrays[j]
        idx = pair[0]
        w = pair[1]
        if met + idx.shape[0] > _met_cap:
            _met = <Py_ssize_t*>_grow(_met, &_met_cap, met + idx.shape[0], sizeof(Py_ssize_t))
        for k in range(idx.shape[0]):
            r = idx[k]
            if r >= _res_cap:
                _fit_resources(r + 1)
            if not _seen_res[r]:
                _seen_res[r] = 1
                _sum_of[r] = 0.0
                _met[met] = r
                met += 1
            _sum_of[r] = _sum_of[r] + w[k]
    cdef list order = []
    for k in range(met):
        r = _met[k]
        if _sum_of[r] > _HOT_LIMIT:
            order.append(r)
    cdef list touching = []
    cdef bint touches
    if order:
        for j in range(n):
            idx = (<tuple>arrays[j])[0]
            touches = False
            for k in range(idx.shape[0]):
                if _sum_of[idx[k]] > _HOT_LIMIT:
                    touches = True
                    break
            if numbers is None:
                touching.append(touches)
            else:
                touching.append(numbers[j] if touches else -1)
    for k in range(met):
        _seen_res[_met[k]] = 0
    return order, touching


cdef Py_ssize_t _root(Py_ssize_t* parent, Py_ssize_t j):
    while parent[j] != j:
        parent[j] = parent[parent[j]]
        j = parent[j]
    return j


def components_of_arrays(list arrays, list order):
    """fair_rates.components_of_arrays as C loops: jobs joined (union-find) when both load a common hot
    resource (`order`, resource indices) with a positive load; per component, in order of its first job,
    (its columns ascending, its jobs ascending)."""
    cdef Py_ssize_t n = len(arrays), m = len(order), j, k, r, c, root
    cdef const Py_ssize_t[::1] idx
    cdef const double[::1] w
    for c in range(m):
        r = order[c]
        if r >= _res_cap:
            _fit_resources(r + 1)
        _column_of[r] = c
    cdef Py_ssize_t* parent = <Py_ssize_t*>malloc((n + m + 1) * sizeof(Py_ssize_t))
    cdef char* used = <char*>malloc(n + 1)
    if parent == NULL or used == NULL:
        free(parent)
        free(used)
        raise MemoryError()
    cdef Py_ssize_t* first_user = parent + n
    cdef list comps = []
    cdef list cols, jobs
    try:
        for j in range(n):
            parent[j] = j
            used[j] = 0
        for c in range(m):
            first_user[c] = -1
        for j in range(n):
            pair = <tuple>arrays[j]
            idx = pair[0]
            w = pair[1]
            for k in range(idx.shape[0]):
                r = idx[k]
                if r >= _res_cap:
                    continue
                c = _column_of[r]
                if c < 0 or not (w[k] > 0):
                    continue
                used[j] = 1
                if first_user[c] < 0:
                    first_user[c] = j
                else:
                    root = _root(parent, first_user[c])
                    r = _root(parent, j)
                    if r != root:
                        parent[r] = root
        for j in range(n):
            if used[j] != 1:
                continue
            root = _root(parent, j)
            jobs = []
            for k in range(j, n):
                if used[k] == 1 and _root(parent, k) == root:
                    used[k] = 2
                    jobs.append(k)
            cols = []
            for c in range(m):
                if first_user[c] >= 0 and _root(parent, first_user[c]) == root:
                    cols.append(c)
            comps.append((cols, jobs))
    finally:
        for c in range(m):
            _column_of[<Py_ssize_t>order[c]] = -1
        free(parent)
        free(used)
    return comps
