# Included by _core.pyx before _fair_rates.pxi (one extension: FairRates calls these as C functions).
"""One component's progressive filling for FairRates (_fair_rates.pxi): sim/cost/collectives/_maxmin.pyx's
_fill with every capacity 1.0, the same IEEE operations in the same order (that module's docstring states
them), over C buffers."""

cdef inline double _fr_share(double left, double weight):
    """max(left, 0.0) / weight (maxmin.py; division by zero raises, as there)."""
    if 0.0 > left:
        left = 0.0
    return left / weight


cdef list _maxmin_fill(Py_ssize_t n, Py_ssize_t nres, Py_ssize_t* start, Py_ssize_t* res, double* wt,
                       double factor, double tiny, bint plain_sum):
    """sim/cost/collectives/_maxmin.pyx _fill with every capacity 1.0 (float(1.0)): the same operations in
    the same order (that module's docstring states them)."""
    cdef Py_ssize_t nnz = start[n], i, e, r, k, u, nopen, ntight
    cdef double level = 0.0, limit, ratio, x
    cdef Py_ssize_t* ustart = <Py_ssize_t*>malloc((4 * nres + nnz + 1) * sizeof(Py_ssize_t))
    cdef double* uw = <double*>malloc((nnz + 2 * nres + 1) * sizeof(double))
    cdef char* is_open = <char*>malloc(nres + n + 1)
    if ustart == NULL or uw == NULL or is_open == NULL:
        free(ustart)
        free(uw)
        free(is_open)
        raise MemoryError()
    cdef Py_ssize_t* fill = ustart + nres + 1
    cdef Py_ssize_t* uflow = fill + nres
    cdef Py_ssize_t* active = uflow + nnz
    cdef Py_ssize_t* tight = active + nres
    cdef double* left = uw + nnz
    cdef double* weight = left + nres
    cdef char* frozen = is_open + nres
    cdef list rates
    try:
        for r in range(nres + 1):
            ustart[r] = 0
        for r in range(nres):
            is_open[r] = 1
        for i in range(n):
            frozen[i] = 1
        for e in range(nnz):  # users of each resource, in flow order (CSR by resource)
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
        for r in range(nres):
            left[r] = 1.0
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
        rates = [float("inf")] * n
        nopen = nres
        while nopen > 0:
            k = 0
            for r in range(nres):
                if is_open[r]:
                    ratio = _fr_share(left[r], weight[r])
                    if k == 0 or ratio < level:
                        level = ratio
                    k = 1
            limit = level * factor + tiny
            ntight = 0
            for r in range(nres):
                if is_open[r]:
                    if _fr_share(left[r], weight[r]) <= limit:
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
    finally:
        free(ustart)
        free(uw)
        free(is_open)
    return rates
