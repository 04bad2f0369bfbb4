# Included by _core.pyx (one extension: the Core calls these as C functions).
"""fair_rates (sim/engine/fair_rates.py) as C loops over loads interned once per run: the Core's arbiter asks
FairRates for the rates of the loads draining at once without a call into Python.

A load mapping is interned once (by identity, kept alive): its items in order as a resource index array and
a weight array (CSR over the run's loads), and a number shared by every load with equal items in the same
order (arbiter.MemoRates numbers loads the same way). A call for the loads ix[0..n) then does fair_rates'
steps in fair_rates' order:

- each resource's load summed from 0.0, load by load, item by item (fair_rates' dict loop: the same IEEE
  additions); hot resources (sum > 1 + 1e-12) listed in order of first appearance;
- jobs joined into components when they load a common hot resource with a positive load (union-find), per
  component in order of its first job, its hot resources in hot order (fair_rates._components);
- per component, progressive filling (maxmin.maxmin_rates, as _maxmin.pyx transliterates it) over the
  demands fair_rates._fill builds: job j's positive loads on the component's hot resources in that order,
  then a private resource of capacity 1 (resources numbered in first-use order), capacity 1 everywhere;
  each rate then min(1.0, r); a job in no component runs at 1.

Three exact memos, as MemoRates and fair_rates_of_arrays keep them: by the loads' numbers (equal ordered
items, equal floats); by (hot resources in order, per load its number or -1 when it has no hot resource):
the filling reads nothing else; and per component by (its hot resources in order, its loads' numbers). A load outside what the C loops cover (a weight that is not a float or is NaN,
a resource key that is not a non-negative int or a tuple: the private resources are negative ints) makes
the call return None; the caller then asks the Python reference (`fallback`).
"""

from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.math cimport isnan
from libc.stdlib cimport qsort

cdef dict _FR_RESOURCE = {}       # a load's resource key -> dense index (never reused)
cdef dict _FR_NUMBER = {}         # a plain load's items in order -> its number (never reused)
cdef long long _FR_NEXT = 0
cdef dict _FR_BY_NUMBERS = {}     # the loads' numbers (bytes) -> rates
cdef dict _FR_BY_HOT = {}         # (hot resources in order, per load its number or -1) as bytes -> rates
cdef dict _FR_BY_COMPONENT = {}   # (a component's hot resources in order, its loads' numbers) -> its rates
cdef Py_ssize_t _FR_MAX = 1 << 16  # per table, as fair_rates.MAX_ENTRIES: a full table is emptied
cdef double* _fr_sum = NULL       # per resource: its summed load in the current call
cdef char* _fr_seen = NULL        # per resource: 1 while the current call has met it
cdef Py_ssize_t* _fr_col = NULL   # per resource: its position among the hot ones, -1 otherwise
cdef double* _fr_val = NULL       # per resource: the current job's load on it (0.0 when none)
cdef Py_ssize_t* _fr_pos = NULL   # per resource: its entry in the load being paired (-1 otherwise)
cdef long long* _fr_stamp = NULL  # per resource: the call (_fr_gen) that last met it as shared
cdef Py_ssize_t* _fr_last = NULL  # per resource: the last job of that call whose load was added to its sum
cdef long long* _fr_first = NULL  # per resource: (job << 32) | entry position of its first appearance
cdef long long _fr_gen = 0
cdef Py_ssize_t _fr_cap = 0


cdef int _fr_fit(Py_ssize_t need) except -1:
    """Grow the per-resource scratch to `need` entries (new ones unseen, no column, no load)."""
    global _fr_sum, _fr_seen, _fr_col, _fr_val, _fr_pos, _fr_stamp, _fr_last, _fr_first, _fr_cap
    if need <= _fr_cap:
        return 0
    cdef Py_ssize_t old = _fr_cap, i
    cdef Py_ssize_t cap = old
    _fr_sum = <double*>_grow(_fr_sum, &cap, need, sizeof(double))
    cap = old
    _fr_seen = <char*>_grow(_fr_seen, &cap, need, sizeof(char))
    cap = old
    _fr_col = <Py_ssize_t*>_grow(_fr_col, &cap, need, sizeof(Py_ssize_t))
    cap = old
    _fr_val = <double*>_grow(_fr_val, &cap, need, sizeof(double))
    cap = old
    _fr_pos = <Py_ssize_t*>_grow(_fr_pos, &cap, need, sizeof(Py_ssize_t))
    cap = old
    _fr_stamp = <long long*>_grow(_fr_stamp, &cap, need, sizeof(long long))
    cap = old
    _fr_last = <Py_ssize_t*>_grow(_fr_last, &cap, need, sizeof(Py_ssize_t))
    cap = old
    _fr_first = <long long*>_grow(_fr_first, &cap, need, sizeof(long long))
    for i in range(old, cap):
        _fr_seen[i] = 0
        _fr_col[i] = -1
        _fr_val[i] = 0.0
        _fr_pos[i] = -1
        _fr_stamp[i] = 0
    _fr_cap = cap
    return 0


cdef int _fr_by_first(const void* a, const void* b) noexcept nogil:
    """qsort order of (first appearance, resource) pairs: by first appearance (distinct per resource)."""
    cdef long long x = (<const long long*>a)[0], y = (<const long long*>b)[0]
    return (x > y) - (x < y)


cdef inline bint _fr_plain_key(object key):
    """A resource key the private resources -(j + 1) cannot equal: a non-negative int or a tuple."""
    return (type(key) is int and key >= 0) or type(key) is tuple


cdef class FairRates:
    """The rates of concurrent loads, fair_rates' floats, over loads interned once (module docstring).
    Called with a list of loads it answers like fair_rates (the differential tests call it so); the Core
    calls rates_of on the interned indices. `fallback`: the reference (arbiter.MemoRates), asked for loads
    the C loops do not cover; factor, tiny, plain_sum: maxmin.py's saturation constants and sum rule."""
    cdef public object fallback
    cdef double factor, tiny
    cdef bint plain_sum
    cdef dict index_of                # id(load) -> its index here
    cdef list kept                    # the loads by index (kept alive: their ids stay theirs)
    cdef long long* number            # per load: its number (-1: outside the C loops)
    cdef Py_ssize_t* ptr              # per load: where its items start in res / wt (CSR; n_loads + 1)
    cdef Py_ssize_t* res
    cdef double* wt
    cdef Py_ssize_t n_loads, cap_number, cap_ptr, nnz, cap_res, cap_wt
    cdef long long* key               # per call: the memo key being built
    cdef Py_ssize_t cap_key
    cdef Py_ssize_t* met              # per call: resources met, then the hot ones in order
    cdef Py_ssize_t cap_met
    cdef Py_ssize_t* ix               # the Core's per-call list of load indices
    cdef Py_ssize_t cap_ix
    cdef Py_ssize_t* hot_ptr          # per load: where its entries over the threshold start in hot_e (CSR)
    cdef Py_ssize_t* hot_e            # their entry indices
    cdef Py_ssize_t cap_hot_ptr, n_hot_e, cap_hot_e
    cdef dict pair_index              # (la << 32) | lb -> the pair's index: its shared entries are known
    cdef Py_ssize_t* pair_ptr         # per pair: where its shared entries start in pair_a / pair_b (CSR)
    cdef Py_ssize_t* pair_a           # a shared resource's entry in la's items
    cdef Py_ssize_t* pair_b           # the same resource's entry in lb's items
    cdef Py_ssize_t n_pairs, cap_pair_ptr, cap_pair_a, cap_pair_b
    cdef Py_ssize_t* task_j           # per call: (job, entry) of each shared entry met through a pair
    cdef Py_ssize_t* task_e
    cdef Py_ssize_t* bucket           # per call: the tasks bucketed by job (CSR over jobs: bucket_ptr)
    cdef Py_ssize_t* bucket_ptr
    cdef Py_ssize_t* shared           # per call: the shared resources met
    cdef long long* order_key         # per call: hot candidates' (first appearance, resource) pairs
    cdef Py_ssize_t cap_task_j, cap_task_e, cap_bucket, cap_bucket_ptr, cap_shared, cap_order_key

    def __cinit__(self):
        self.ptr = <Py_ssize_t*>_grow(NULL, &self.cap_ptr, 1, sizeof(Py_ssize_t))
        self.ptr[0] = 0
        self.hot_ptr = <Py_ssize_t*>_grow(NULL, &self.cap_hot_ptr, 1, sizeof(Py_ssize_t))
        self.hot_ptr[0] = 0
        self.pair_ptr = <Py_ssize_t*>_grow(NULL, &self.cap_pair_ptr, 1, sizeof(Py_ssize_t))
        self.pair_ptr[0] = 0
        self.pair_index = {}

    def __init__(self, fallback, double factor, double tiny, bint plain_sum):
        self.fallback, self.factor, self.tiny, self.plain_sum = fallback, factor, tiny, plain_sum
        self.index_of, self.kept = {}, []

    def __dealloc__(self):
        free(self.number)
        free(self.ptr)
        free(self.res)
        free(self.wt)
        free(self.key)
        free(self.met)
        free(self.ix)
        free(self.hot_ptr)
        free(self.hot_e)
        free(self.pair_ptr)
        free(self.pair_a)
        free(self.pair_b)
        free(self.task_j)
        free(self.task_e)
        free(self.bucket)
        free(self.bucket_ptr)
        free(self.shared)
        free(self.order_key)

    def __call__(self, loads):
        """fair_rates(loads): each load interned, the C loops, or the fallback for loads outside them."""
        cdef Py_ssize_t n = len(loads), k
        self.ix = <Py_ssize_t*>_grow(self.ix, &self.cap_ix, n + 1, sizeof(Py_ssize_t))
        for k in range(n):
            self.ix[k] = self.intern(loads[k])
        rates = self.rates_of(self.ix, n)
        return list(self.fallback(list(loads)) if rates is None else rates)

    cdef Py_ssize_t intern(self, object load) except -1:
        """The load's index here, interning it on first sight (module docstring)."""
        global _FR_NEXT
        hit = self.index_of.get(PyLong_FromVoidPtr(<void*>load))
        if hit is not None:
            return <Py_ssize_t>hit
        cdef Py_ssize_t i = self.n_loads, r, e
        cdef long long number = -1
        items = tuple(load.items())
        cdef bint plain = True
        for key, w in items:
            if type(w) is not float or isnan(<double>w) or not _fr_plain_key(key):
                plain = False
                break
        self.number = <long long*>_grow(self.number, &self.cap_number, i + 1, sizeof(long long))
        self.ptr = <Py_ssize_t*>_grow(self.ptr, &self.cap_ptr, i + 2, sizeof(Py_ssize_t))
        e = self.nnz
        if plain:
            got = _FR_NUMBER.get(items)
            if got is None:
                if len(_FR_NUMBER) >= _FR_MAX:
                    _FR_NUMBER.clear()  # numbers are never reused: older ones only stop matching
                got = _FR_NUMBER[items] = _FR_NEXT
                _FR_NEXT += 1
            number = got
            self.res = <Py_ssize_t*>_grow(self.res, &self.cap_res, e + len(items), sizeof(Py_ssize_t))
            self.wt = <double*>_grow(self.wt, &self.cap_wt, e + len(items), sizeof(double))
            for key, w in items:
                got = _FR_RESOURCE.get(key)
                if got is None:
                    got = _FR_RESOURCE[key] = len(_FR_RESOURCE)
                r = got
                _fr_fit(r + 1)
                self.res[e] = r
                self.wt[e] = w
                e += 1
        self.number[i] = number
        self.hot_ptr = <Py_ssize_t*>_grow(self.hot_ptr, &self.cap_hot_ptr, i + 2, sizeof(Py_ssize_t))
        self.hot_e = <Py_ssize_t*>_grow(self.hot_e, &self.cap_hot_e, self.n_hot_e + e - self.nnz + 1,
                                        sizeof(Py_ssize_t))
        for r in range(self.nnz, e):  # entries hot on their own (0.0 + w > the threshold)
            if self.wt[r] > _HOT_LIMIT:
                self.hot_e[self.n_hot_e] = r
                self.n_hot_e += 1
        self.hot_ptr[i + 1] = self.n_hot_e
        self.nnz = e
        self.ptr[i + 1] = e
        self.n_loads = i + 1
        self.kept.append(load)
        self.index_of[PyLong_FromVoidPtr(<void*>load)] = i
        return i

    cdef object rates_of(self, Py_ssize_t* ix, Py_ssize_t n):
        """The rates (a list, shared with the memo: read it, do not change it) of the loads ix[0..n), or
        None when one of them is outside the C loops."""
        cdef Py_ssize_t k
        self.key = <long long*>_grow(self.key, &self.cap_key, n + 1, sizeof(long long))
        for k in range(n):
            if self.number[ix[k]] < 0:
                return None
            self.key[k] = self.number[ix[k]]
        memo_key = PyBytes_FromStringAndSize(<char*>self.key, n * sizeof(long long))
        rates = _FR_BY_NUMBERS.get(memo_key)
        if rates is None:
            rates = [1.0] if n == 1 else self.by_hot(ix, n)
            if len(_FR_BY_NUMBERS) >= _FR_MAX:
                _FR_BY_NUMBERS.clear()
            _FR_BY_NUMBERS[memo_key] = rates
        return rates

    cdef list by_hot(self, Py_ssize_t* ix, Py_ssize_t n):
        """The hot resources in order of first appearance (hot_by_pairs); then the hot memo, or the
        components' fillings."""
        cdef Py_ssize_t k
        cdef Py_ssize_t nhot = self.hot_by_pairs(ix, n)
        if nhot == 0:
            return [1.0] * n
        for k in range(nhot):
            _fr_col[self.met[k]] = k
        try:
            self.key = <long long*>_grow(self.key, &self.cap_key, nhot + n + 1, sizeof(long long))
            self.key[0] = nhot
            for k in range(nhot):
                self.key[1 + k] = self.met[k]
            self.marks_by_pairs(ix, n, self.key + 1 + nhot)
            memo_key = PyBytes_FromStringAndSize(<char*>self.key, (1 + nhot + n) * sizeof(long long))
            rates = _FR_BY_HOT.get(memo_key)
            if rates is None:
                rates = self.components(ix, n, nhot)
                if len(_FR_BY_HOT) >= _FR_MAX:
                    _FR_BY_HOT.clear()
                _FR_BY_HOT[memo_key] = rates
        finally:
            for k in range(nhot):
                _fr_col[self.met[k]] = -1
        return rates

    cdef Py_ssize_t hot_by_scan(self, Py_ssize_t* ix, Py_ssize_t n) except -1:
        """The long way (fair_rates' own): sum every resource's load from 0.0, load by load, item by item;
        the hot ones (sum > 1 + 1e-12), in order of first appearance, into met[0..nhot); returns nhot."""
        cdef Py_ssize_t k, e, r, m = 0, nhot = 0, total = 0
        for k in range(n):
            total += self.ptr[ix[k] + 1] - self.ptr[ix[k]]
        self.met = <Py_ssize_t*>_grow(self.met, &self.cap_met, total + 1, sizeof(Py_ssize_t))
        for k in range(n):
            for e in range(self.ptr[ix[k]], self.ptr[ix[k] + 1]):
                r = self.res[e]
                if not _fr_seen[r]:
                    _fr_seen[r] = 1
                    _fr_sum[r] = 0.0
                    self.met[m] = r
                    m += 1
                _fr_sum[r] = _fr_sum[r] + self.wt[e]
        for k in range(m):  # unmark every met resource; keep the hot ones, in order, at the front
            r = self.met[k]
            _fr_seen[r] = 0
            if _fr_sum[r] > _HOT_LIMIT:
                self.met[nhot] = r
                nhot += 1
        return nhot

    cdef int marks_by_scan(self, Py_ssize_t* ix, Py_ssize_t n, long long* out) except -1:
        """Per load, its number if one of its resources is hot (_fr_col set), else -1, by scanning its items."""
        cdef Py_ssize_t k, e
        cdef bint touches
        for k in range(n):
            touches = False
            for e in range(self.ptr[ix[k]], self.ptr[ix[k] + 1]):
                if _fr_col[self.res[e]] >= 0:
                    touches = True
                    break
            out[k] = self.number[ix[k]] if touches else -1
        return 0

    cdef Py_ssize_t pair_of(self, Py_ssize_t la, Py_ssize_t lb) except -1:
        """The pair (la, lb)'s index; its shared resources (entry in la, entry in lb; in lb's item order) are
        found once per run by marking la's resources and scanning lb's."""
        key = (<long long>la << 32) | lb
        hit = self.pair_index.get(key)
        if hit is not None:
            return <Py_ssize_t>hit
        cdef Py_ssize_t p = self.n_pairs, e, f, q = self.pair_ptr[self.n_pairs]
        cdef Py_ssize_t most = q + min(self.ptr[la + 1] - self.ptr[la], self.ptr[lb + 1] - self.ptr[lb]) + 1
        self.pair_a = <Py_ssize_t*>_grow(self.pair_a, &self.cap_pair_a, most, sizeof(Py_ssize_t))
        self.pair_b = <Py_ssize_t*>_grow(self.pair_b, &self.cap_pair_b, most, sizeof(Py_ssize_t))
        self.pair_ptr = <Py_ssize_t*>_grow(self.pair_ptr, &self.cap_pair_ptr, p + 2, sizeof(Py_ssize_t))
        for e in range(self.ptr[la], self.ptr[la + 1]):
            _fr_pos[self.res[e]] = e
        for f in range(self.ptr[lb], self.ptr[lb + 1]):
            e = _fr_pos[self.res[f]]
            if e >= 0:
                self.pair_a[q] = e
                self.pair_b[q] = f
                q += 1
        for e in range(self.ptr[la], self.ptr[la + 1]):
            _fr_pos[self.res[e]] = -1
        self.pair_ptr[p + 1] = q
        self.n_pairs = p + 1
        self.pair_index[key] = p
        return p

    cdef Py_ssize_t hot_by_pairs(self, Py_ssize_t* ix, Py_ssize_t n) except -1:
        """hot_by_scan's list without visiting every item: a resource met by one load only sums to
        0.0 + w = w, hot when w itself is over the threshold (the load's hot_e entries, known at intern); a
        resource shared by several loads is met through the pairs of loads that share it (pair_of), and
        only those are summed, from 0.0, load by load in job order (each load once: _fr_last). The hot ones
        are then ordered by first appearance, (job, entry position), as the long way meets them."""
        global _fr_gen
        _fr_gen += 1
        cdef long long gen = _fr_gen, first
        cdef Py_ssize_t j, k, p, q, t, e, r, nt = 0, nsh = 0, nhot = 0, most = 0
        for j in range(n):  # the tasks: each shared entry of each job, via the pairs
            for k in range(j + 1, n):
                p = self.pair_of(ix[j], ix[k])
                most = nt + 2 * (self.pair_ptr[p + 1] - self.pair_ptr[p]) + 1
                self.task_j = <Py_ssize_t*>_grow(self.task_j, &self.cap_task_j, most, sizeof(Py_ssize_t))
                self.task_e = <Py_ssize_t*>_grow(self.task_e, &self.cap_task_e, most, sizeof(Py_ssize_t))
                for q in range(self.pair_ptr[p], self.pair_ptr[p + 1]):
                    self.task_j[nt] = j
                    self.task_e[nt] = self.pair_a[q]
                    self.task_j[nt + 1] = k
                    self.task_e[nt + 1] = self.pair_b[q]
                    nt += 2
        self.bucket_ptr = <Py_ssize_t*>_grow(self.bucket_ptr, &self.cap_bucket_ptr, n + 2, sizeof(Py_ssize_t))
        self.bucket = <Py_ssize_t*>_grow(self.bucket, &self.cap_bucket, nt + 1, sizeof(Py_ssize_t))
        self.shared = <Py_ssize_t*>_grow(self.shared, &self.cap_shared, nt + 1, sizeof(Py_ssize_t))
        for j in range(n + 2):
            self.bucket_ptr[j] = 0
        for t in range(nt):  # counting sort of the tasks by job
            self.bucket_ptr[self.task_j[t] + 2] += 1
        for j in range(n):
            self.bucket_ptr[j + 2] += self.bucket_ptr[j + 1]
        for t in range(nt):
            j = self.task_j[t] + 1
            self.bucket[self.bucket_ptr[j]] = self.task_e[t]
            self.bucket_ptr[j] += 1
        for j in range(n):  # the shared resources' sums, job by job (bucket_ptr[j]..[j + 1]: job j's tasks)
            for t in range(self.bucket_ptr[j], self.bucket_ptr[j + 1]):
                e = self.bucket[t]
                r = self.res[e]
                if _fr_stamp[r] != gen:
                    _fr_stamp[r] = gen
                    _fr_sum[r] = 0.0
                    _fr_last[r] = -1
                    _fr_first[r] = (<long long>j << 32) | (e - self.ptr[ix[j]])
                    self.shared[nsh] = r
                    nsh += 1
                if _fr_last[r] == j:
                    continue
                _fr_last[r] = j
                _fr_sum[r] = _fr_sum[r] + self.wt[e]
        most = nsh + 1
        for j in range(n):
            most += self.hot_ptr[ix[j] + 1] - self.hot_ptr[ix[j]]
        self.order_key = <long long*>_grow(self.order_key, &self.cap_order_key, 2 * most, sizeof(long long))
        for t in range(nsh):
            r = self.shared[t]
            if _fr_sum[r] > _HOT_LIMIT:
                self.order_key[2 * nhot] = _fr_first[r]
                self.order_key[2 * nhot + 1] = r
                nhot += 1
        for j in range(n):  # loads' own hot entries on resources no other load meets
            for t in range(self.hot_ptr[ix[j]], self.hot_ptr[ix[j] + 1]):
                e = self.hot_e[t]
                r = self.res[e]
                if _fr_stamp[r] != gen:
                    self.order_key[2 * nhot] = (<long long>j << 32) | (e - self.ptr[ix[j]])
                    self.order_key[2 * nhot + 1] = r
                    nhot += 1
        if nhot:
            qsort(self.order_key, nhot, 2 * sizeof(long long), _fr_by_first)
        self.met = <Py_ssize_t*>_grow(self.met, &self.cap_met, nhot + 1, sizeof(Py_ssize_t))
        for t in range(nhot):
            self.met[t] = <Py_ssize_t>self.order_key[2 * t + 1]
        return nhot

    cdef int marks_by_pairs(self, Py_ssize_t* ix, Py_ssize_t n, long long* out) except -1:
        """marks_by_scan after hot_by_pairs: a load meets a hot resource through its shared entries (its
        tasks) or its own hot entries (every resource of a load is one or the other when it is hot)."""
        cdef Py_ssize_t j, t
        cdef bint touches
        for j in range(n):
            touches = False
            for t in range(self.bucket_ptr[j], self.bucket_ptr[j + 1]):
                if _fr_col[self.res[self.bucket[t]]] >= 0:
                    touches = True
                    break
            if not touches:
                for t in range(self.hot_ptr[ix[j]], self.hot_ptr[ix[j] + 1]):
                    if _fr_col[self.res[self.hot_e[t]]] >= 0:
                        touches = True
                        break
            out[j] = self.number[ix[j]] if touches else -1
        return 0

    def hot_both_ways(self, loads):
        """(hot resources in order, marks) by the long way (hot_by_scan, marks_by_scan) and by the pairs
        (hot_by_pairs, marks_by_pairs), for loads the C loops cover (tests/test_arbiter_compiled.py)."""
        cdef Py_ssize_t n = len(loads), k, nhot
        self.ix = <Py_ssize_t*>_grow(self.ix, &self.cap_ix, n + 1, sizeof(Py_ssize_t))
        for k in range(n):
            self.ix[k] = self.intern(loads[k])
            if self.number[self.ix[k]] < 0:
                raise ValueError("a load outside the C loops")
        out = []
        cdef long long* marks = <long long*>malloc((n + 1) * sizeof(long long))
        if marks == NULL:
            raise MemoryError()
        try:
            for by_pairs in (False, True):
                nhot = self.hot_by_pairs(self.ix, n) if by_pairs else self.hot_by_scan(self.ix, n)
                order = [self.met[k] for k in range(nhot)]
                for k in range(nhot):
                    _fr_col[self.met[k]] = k
                if by_pairs:
                    self.marks_by_pairs(self.ix, n, marks)
                else:
                    self.marks_by_scan(self.ix, n, marks)
                for k in range(nhot):
                    _fr_col[self.met[k]] = -1
                out.append((order, [marks[k] for k in range(n)] if nhot else []))
        finally:
            free(marks)
        return out

    cdef list components(self, Py_ssize_t* ix, Py_ssize_t n, Py_ssize_t nhot):
        """Per connected component (fair_rates._components: jobs joined by a positive load on a common hot
        resource; in order of the first job), its filling; 1.0 for a job in none."""
        cdef Py_ssize_t j, k, e, c, root, r
        cdef list rates = [1.0] * n
        cdef Py_ssize_t* parent = <Py_ssize_t*>malloc((2 * n + 2 * nhot + 1) * sizeof(Py_ssize_t))
        cdef char* used = <char*>malloc(n + 1)
        if parent == NULL or used == NULL:
            free(parent)
            free(used)
            raise MemoryError()
        cdef Py_ssize_t* first_user = parent + n   # per hot column: its first job with a positive load
        cdef Py_ssize_t* jobs = first_user + nhot  # a component's jobs, ascending
        cdef Py_ssize_t* cols = jobs + n           # its hot columns, ascending
        cdef Py_ssize_t nj, nc
        try:
            for j in range(n):
                parent[j] = j
                used[j] = 0
            for c in range(nhot):
                first_user[c] = -1
            for j in range(n):
                for e in range(self.ptr[ix[j]], self.ptr[ix[j] + 1]):
                    c = _fr_col[self.res[e]]
                    if c < 0 or not (self.wt[e] > 0):
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
                nj = nc = 0
                for k in range(j, n):
                    if used[k] == 1 and _root(parent, k) == root:
                        used[k] = 2
                        jobs[nj] = k
                        nj += 1
                for c in range(nhot):
                    if first_user[c] >= 0 and _root(parent, first_user[c]) == root:
                        cols[nc] = c
                        nc += 1
                part = self.component_rates(ix, jobs, nj, cols, nc)
                for k in range(nj):
                    rates[jobs[k]] = part[k]
        finally:
            free(parent)
            free(used)
        return rates

    cdef list component_rates(self, Py_ssize_t* ix, Py_ssize_t* jobs, Py_ssize_t nj, Py_ssize_t* cols,
                              Py_ssize_t nc):
        """fill, memoized on (the component's hot resources in order, its jobs' numbers): what the demands
        are built from (fair_rates' _COMPONENT_RATES)."""
        cdef Py_ssize_t k
        self.key = <long long*>_grow(self.key, &self.cap_key, nc + nj + 1, sizeof(long long))
        self.key[0] = nc
        for k in range(nc):
            self.key[1 + k] = self.met[cols[k]]
        for k in range(nj):
            self.key[1 + nc + k] = self.number[ix[jobs[k]]]
        memo_key = PyBytes_FromStringAndSize(<char*>self.key, (1 + nc + nj) * sizeof(long long))
        part = _FR_BY_COMPONENT.get(memo_key)
        if part is None:
            part = self.fill(ix, jobs, nj, cols, nc)
            if len(_FR_BY_COMPONENT) >= _FR_MAX:
                _FR_BY_COMPONENT.clear()
            _FR_BY_COMPONENT[memo_key] = part
        return part

    cdef list fill(self, Py_ssize_t* ix, Py_ssize_t* jobs, Py_ssize_t nj, Py_ssize_t* cols, Py_ssize_t nc):
        """fair_rates._fill of one component: the demands (module docstring) as CSR, resources numbered in
        first-use order, then maxmin's progressive filling (_maxmin.pyx _fill, capacity 1.0 everywhere)."""
        cdef Py_ssize_t size = nj * (nc + 1), jj, c, e, cnt = 0, nres = 0, li
        cdef double w
        cdef Py_ssize_t* st = <Py_ssize_t*>malloc((nj + 1 + size + nc + 1) * sizeof(Py_ssize_t))
        cdef double* ws = <double*>malloc((size + 1) * sizeof(double))
        if st == NULL or ws == NULL:
            free(st)
            free(ws)
            raise MemoryError()
        cdef Py_ssize_t* rs = st + nj + 1  # each flow's resources (CSR over st)
        cdef Py_ssize_t* mm = rs + size    # per column: its resource number in the filling (-1: not yet used)
        try:
            for c in range(nc):
                mm[c] = -1
            for jj in range(nj):
                li = ix[jobs[jj]]
                for e in range(self.ptr[li], self.ptr[li + 1]):
                    _fr_val[self.res[e]] = self.wt[e]
                st[jj] = cnt
                for c in range(nc):
                    w = _fr_val[self.met[cols[c]]]
                    if w > 0:
                        if mm[c] < 0:
                            mm[c] = nres
                            nres += 1
                        rs[cnt] = mm[c]
                        ws[cnt] = w
                        cnt += 1
                for e in range(self.ptr[li], self.ptr[li + 1]):
                    _fr_val[self.res[e]] = 0.0
                rs[cnt] = nres  # the job's private resource -(j + 1), capacity 1
                ws[cnt] = 1.0
                nres += 1
                cnt += 1
            st[nj] = cnt
            rates = _maxmin_fill(nj, nres, st, rs, ws, self.factor, self.tiny, self.plain_sum)
        finally:
            free(st)
            free(ws)
        for jj in range(nj):
            w = rates[jj]
            rates[jj] = w if w < 1.0 else 1.0  # min(1.0, r)
        return rates


def clear_memos():
    """Empty FairRates' memo tables (the tests' way to make a call do every step again)."""
    _FR_BY_NUMBERS.clear()
    _FR_BY_HOT.clear()
    _FR_BY_COMPONENT.clear()
