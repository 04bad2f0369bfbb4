# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""maxmin.py's progressive filling as C loops over arrays: the same IEEE operations in the same order.

`maxmin_rates(demands, capacity, factor, tiny, plain_sum)` is maxmin.maxmin_rates_reference step for step:
- resources are numbered in first-use order (the reference's `users` dict), a flow's entries kept in its
  dict's item order with w > 0 (what _usage and _freeze both read);
- capacity is called (or indexed) once per resource in that order and converted with float();
- weight[r] = sum of its users' w in flow order: left to right from 0 when plain_sum (CPython < 3.12),
  else Python's own sum() over the same list (3.12's compensated summation);
- each round: level = the first minimum, in resource order, of (0.0 if 0.0 > left else left) / weight
  (Python's max(left, 0.0) and min()); limit = level * factor + tiny; the tight resources, in order; their
  users frozen in user order, each subtracting w * level from left and w from weight of its resources
  in item order; a resource is closed when its last user freezes or after its users are visited.
Division by a zero weight raises ZeroDivisionError, as the reference's does (cdivision is off).

Returns None, without calling `capacity`, when an input is outside what this transliteration covers
(a demand that is not a dict, a weight that is not a float or is NaN): the caller runs the reference.
"""

from cpython.dict cimport PyDict_Next
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_CheckExact
from cpython.object cimport PyObject
from libc.math cimport isnan
from libc.stdlib cimport free, malloc

import numpy as np


def maxmin_rates(list demands, capacity, double factor, double tiny, bint plain_sum):
    cdef Py_ssize_t n = len(demands), i, pos, r, nnz = 0
    cdef PyObject* key_p
    cdef PyObject* val_p
    cdef double w
    cdef dict index = {}
    cdef object d, key, idx_obj
    cdef list keys = []
    for d in demands:
        if type(d) is not dict:
            return None
        nnz += len(<dict>d)
    cdef Py_ssize_t[::1] start = np.empty(n + 1, dtype=np.intp)
    cdef Py_ssize_t[::1] res = np.empty(max(nnz, 1), dtype=np.intp)
    cdef double[::1] wt = np.empty(max(nnz, 1), dtype=np.float64)
    nnz = 0
    for i in range(n):
        start[i] = nnz
        pos = 0
        while PyDict_Next(<dict>demands[i], &pos, &key_p, &val_p):
            if not PyFloat_CheckExact(<object>val_p):
                return None
            w = PyFloat_AS_DOUBLE(<object>val_p)
            if isnan(w):
                return None
            if not w > 0:
                continue
            key = <object>key_p
            idx_obj = index.get(key)
            if idx_obj is None:
                r = len(keys)
                index[key] = r
                keys.append(key)
            else:
                r = idx_obj
            res[nnz] = r
            wt[nnz] = w
            nnz += 1
    start[n] = nnz
    return _fill(n, len(keys), start, res, wt, keys, capacity, factor, tiny, plain_sum)


cdef inline double _share(double left, double weight):
    """max(left, 0.0) / weight, as the reference's `max(left[r], 0.0) / weight[r]` computes it."""
    if 0.0 > left:
        left = 0.0
    return left / weight


cdef list _fill(Py_ssize_t n, Py_ssize_t nres, Py_ssize_t[::1] start, Py_ssize_t[::1] res, double[::1] wt,
                list keys, capacity, double factor, double tiny, bint plain_sum):
    cdef Py_ssize_t nnz = start[n], i, e, r, k, u, nopen, ntight
    cdef double level = 0.0, limit, ratio, x
    # users of each resource, in flow order (CSR by resource)
    cdef Py_ssize_t[::1] ustart = np.zeros(nres + 1, dtype=np.intp)
    cdef Py_ssize_t[::1] fill = np.empty(max(nres, 1), dtype=np.intp)
    cdef Py_ssize_t[::1] uflow = np.empty(max(nnz, 1), dtype=np.intp)
    cdef double[::1] uw = np.empty(max(nnz, 1), dtype=np.float64)
    for e in range(nnz):
        ustart[res[e] + 1] += 1
    for r in range(nres):
        ustart[r + 1] += ustart[r]
        fill[r] = ustart[r]
    for i in range(n):
        for e in range(start[i], start[i + 1]):
            r = res[e]
            uflow[fill[r]] = i
            uw[fill[r]] = wt[e]
            fill[r] += 1
    cdef double[::1] left = np.empty(max(nres, 1), dtype=np.float64)
    cdef double[::1] weight = np.empty(max(nres, 1), dtype=np.float64)
    cdef Py_ssize_t[::1] active = np.empty(max(nres, 1), dtype=np.intp)
    cdef char[::1] is_open = np.ones(max(nres, 1), dtype=np.int8)
    cdef Py_ssize_t[::1] tight = np.empty(max(nres, 1), dtype=np.intp)
    cdef char[::1] frozen = np.ones(max(n, 1), dtype=np.int8)
    call = callable(capacity)
    for r in range(nres):  # the reference's `left`: capacities in first-use order
        left[r] = float(capacity(keys[r]) if call else capacity[keys[r]])
    for r in range(nres):
        active[r] = ustart[r + 1] - ustart[r]
        if plain_sum:
            x = 0.0
            for u in range(ustart[r], ustart[r + 1]):
                x = x + uw[u]
            weight[r] = x
        else:
            weight[r] = sum([uw[u] for u in range(ustart[r], ustart[r + 1])])
        for u in range(ustart[r], ustart[r + 1]):
            frozen[uflow[u]] = 0
    cdef list rates = [float("inf")] * n
    nopen = nres
    while nopen > 0:
        k = 0
        for r in range(nres):
            if is_open[r]:
                ratio = _share(left[r], weight[r])
                if k == 0 or ratio < level:
                    level = ratio
                k = 1
        limit = level * factor + tiny
        ntight = 0
        for r in range(nres):
            if is_open[r]:
                if _share(left[r], weight[r]) <= limit:
                    tight[ntight] = r
                    ntight += 1
        for k in range(ntight):
            r = tight[k]
            for u in range(ustart[r], ustart[r + 1]):
                i = uflow[u]
                if frozen[i]:
                    continue
                frozen[i] = 1
                rates[i] = level
                for e in range(start[i], start[i + 1]):
                    x = wt[e]
                    left[res[e]] = left[res[e]] - x * level
                    weight[res[e]] = weight[res[e]] - x
                    active[res[e]] -= 1
                    if active[res[e]] == 0 and is_open[res[e]]:
                        is_open[res[e]] = 0
                        nopen -= 1
            if is_open[r]:
                is_open[r] = 0
                nopen -= 1
    return rates


def phase_rates(own, extra, list capacity_bps, double factor, double tiny, bint plain_sum):
    """phases._phase_rates_reference as C loops: (max over own flows of frac / rate, per-link busy seconds
    per byte) of one phase, or None where the reference would divide by zero or meet a NaN (it runs then).

    The same steps: flows with links and frac > 0 merged per (links, frac) in first-seen order, own or
    concurrent, with their multiplicity m; each merged flow's demand m on each of its links (first
    occurrence: dict.fromkeys); the filling above with capacity capacity_bps[link]; busy[link] summed from
    0.0 over merged flows in order and their links with repeats, m x frac / capacity_bps[link] each, in the
    order links are first seen (the filling's resource order)."""
    cdef dict keys = {}
    cdef list mult = [], items = []
    cdef list own_idx = []
    cdef Py_ssize_t i, j, e, r, nlinks = len(capacity_bps), nnz = 0, n, li
    cdef double frac, rate, s_per_byte, cap
    cdef bint is_own
    for is_own, flows in ((True, own), (False, extra)):
        for f in flows:
            links = f.links
            frac_o = f.frac
            if not links or frac_o <= 0:
                continue
            if type(frac_o) is not float or isnan(<double>frac_o) or type(links) is not tuple:
                return None
            key = (links, frac_o)
            idx = keys.setdefault(key, len(keys))
            if idx == len(mult):
                mult.append(0)
                items.append(key)
            mult[idx] += 1
            if is_own:
                own_idx.append(idx)
    n = len(items)
    for key in items:
        nnz += len(<tuple>key[0])
    cdef Py_ssize_t[::1] start = np.empty(n + 1, dtype=np.intp)
    cdef Py_ssize_t[::1] res = np.empty(max(nnz, 1), dtype=np.intp)
    cdef double[::1] wt = np.empty(max(nnz, 1), dtype=np.float64)
    cdef Py_ssize_t[::1] ridx = np.full(max(nlinks, 1), -1, dtype=np.intp)
    cdef Py_ssize_t[::1] stamp = np.full(max(nlinks, 1), -1, dtype=np.intp)  # the last flow that used a link
    cdef list res_keys = []
    nnz = 0
    for i in range(n):
        start[i] = nnz
        links = (<tuple>items[i])[0]
        for j in range(len(<tuple>links)):
            lo = (<tuple>links)[j]
            if type(lo) is not int:
                return None
            li = lo
            if not 0 <= li < nlinks:
                return None
            if stamp[li] == i:  # dict.fromkeys: a link repeated in one route is one demand
                continue
            stamp[li] = i
            if ridx[li] < 0:
                ridx[li] = len(res_keys)
                res_keys.append(li)
            res[nnz] = ridx[li]
            wt[nnz] = <double>(<Py_ssize_t>mult[i])
            nnz += 1
    start[n] = nnz
    cdef list rates = _fill(n, len(res_keys), start, res, wt, res_keys, capacity_bps, factor, tiny, plain_sum)
    s_per_byte = 0.0
    for j in range(len(own_idx)):
        i = own_idx[j]
        rate = rates[i]
        if rate == 0.0 or isnan(rate):
            return None
        frac = (<tuple>items[i])[1]
        if j == 0 or frac / rate > s_per_byte:
            s_per_byte = frac / rate
    cdef double[::1] acc = np.zeros(max(len(res_keys), 1), dtype=np.float64)
    for i in range(n):
        links = (<tuple>items[i])[0]
        frac = (<tuple>items[i])[1]
        for j in range(len(<tuple>links)):
            li = (<tuple>links)[j]
            cap = capacity_bps[li]
            if cap == 0.0:
                return None
            r = ridx[li]
            acc[r] = acc[r] + (<double>(<Py_ssize_t>mult[i])) * frac / cap
    return s_per_byte, {res_keys[r]: acc[r] for r in range(len(res_keys))}
