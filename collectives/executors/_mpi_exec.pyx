# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled executor for the MPI transport: walks a whole plan in C.

One call per collective instead of one Python round trip per step: MPI_Irecv/MPI_Isend
straight from the plan's arrays, MPI_Waitall (or a Testall loop with a deadline), then the
step's copies and reductions as C loops, all without the GIL. Its twin is
``collectives.executors.host.execute``; the tests hold the two to the same bits.

The plan arrives flattened by ``compiled.py`` (buffers: 0 input, 1 output, 2 scratch):
    steps  (n_steps, 3)   number of receives, sends, local ops of each step
    xfers  (n_xfers, 4)   peer, buffer, offset, count   (receives of a step first, then sends)
    ops    (n_ops, 8)     kind (0 copy, 1 reduce), dst buffer, dst offset, a buffer, a offset,
                          b buffer, b offset, count
Offsets and counts are in elements; ``itemsize`` turns them into bytes.
"""
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, free
from libc.string cimport memmove
from posix.time cimport clock_gettime, CLOCK_MONOTONIC, timespec, nanosleep

from mpi4py.libmpi cimport (MPI_Comm, MPI_Request, MPI_Status, MPI_Isend, MPI_Irecv,
                            MPI_Waitall, MPI_Testall, MPI_Cancel, MPI_Wait, MPI_Get_count,
                            MPI_BYTE, MPI_SUCCESS, MPI_STATUS_IGNORE, MPI_Error_class)
from mpi4py.MPI cimport Comm

cdef extern from *:
    """
    #if defined(OPEN_MPI)
    #define COLLECTIVES_MPI_FAMILY "Open MPI"
    #elif defined(MPICH_VERSION) || defined(MPICH)
    #define COLLECTIVES_MPI_FAMILY "MPICH"
    #else
    #define COLLECTIVES_MPI_FAMILY "unknown"
    #endif
    """
    const char* COLLECTIVES_MPI_FAMILY

BUILT_FOR = COLLECTIVES_MPI_FAMILY.decode()

# dtype codes (compiled.py maps numpy dtypes to these) and op codes (ReduceOp values)
DEF F32 = 0
DEF F64 = 1
DEF I8 = 2
DEF I16 = 3
DEF I32 = 4
DEF I64 = 5
DEF U8 = 6
DEF U16 = 7
DEF U32 = 8
DEF U64 = 9
DEF SUM = 0
DEF PRODUCT = 2
DEF MIN = 3
DEF MAX = 4
DEF BAND = 5
DEF BOR = 6
DEF BXOR = 7

ctypedef fused number:
    float
    double
    int8_t
    int16_t
    int32_t
    int64_t
    uint8_t
    uint16_t
    uint32_t
    uint64_t

ctypedef fused integer:
    int8_t
    int16_t
    int32_t
    int64_t
    uint8_t
    uint16_t
    uint32_t
    uint64_t


cdef inline bint _isnan(double x) noexcept nogil:
    return x != x


cdef void _arith(number* dst, const number* a, const number* b, Py_ssize_t n, int op) noexcept nogil:
    """dst = a op b for SUM/PRODUCT/MIN/MAX; MIN/MAX propagate NaN like numpy's minimum."""
    cdef Py_ssize_t i
    cdef number x, y
    if op == SUM:
        for i in range(n):
            dst[i] = a[i] + b[i]
    elif op == PRODUCT:
        for i in range(n):
            dst[i] = a[i] * b[i]
    elif op == MIN:
        for i in range(n):
            x = a[i]; y = b[i]
            if number is float or number is double:
                dst[i] = x if (_isnan(x) or x <= y) else y
            else:
                dst[i] = x if x <= y else y
    elif op == MAX:
        for i in range(n):
            x = a[i]; y = b[i]
            if number is float or number is double:
                dst[i] = x if (_isnan(x) or x >= y) else y
            else:
                dst[i] = x if x >= y else y


cdef void _bits(integer* dst, const integer* a, const integer* b, Py_ssize_t n, int op) noexcept nogil:
    cdef Py_ssize_t i
    if op == BAND:
        for i in range(n):
            dst[i] = a[i] & b[i]
    elif op == BOR:
        for i in range(n):
            dst[i] = a[i] | b[i]
    elif op == BXOR:
        for i in range(n):
            dst[i] = a[i] ^ b[i]
    else:
        _arith(dst, a, b, n, op)


cdef void _reduce(int dtype, int op, char* dst, char* a, char* b, Py_ssize_t n) noexcept nogil:
    if dtype == F32:
        _arith(<float*>dst, <float*>a, <float*>b, n, op)
    elif dtype == F64:
        _arith(<double*>dst, <double*>a, <double*>b, n, op)
    elif dtype == I8:
        _bits(<int8_t*>dst, <int8_t*>a, <int8_t*>b, n, op)
    elif dtype == I16:
        _bits(<int16_t*>dst, <int16_t*>a, <int16_t*>b, n, op)
    elif dtype == I32:
        _bits(<int32_t*>dst, <int32_t*>a, <int32_t*>b, n, op)
    elif dtype == I64:
        _bits(<int64_t*>dst, <int64_t*>a, <int64_t*>b, n, op)
    elif dtype == U8:
        _bits(<uint8_t*>dst, <uint8_t*>a, <uint8_t*>b, n, op)
    elif dtype == U16:
        _bits(<uint16_t*>dst, <uint16_t*>a, <uint16_t*>b, n, op)
    elif dtype == U32:
        _bits(<uint32_t*>dst, <uint32_t*>a, <uint32_t*>b, n, op)
    elif dtype == U64:
        _bits(<uint64_t*>dst, <uint64_t*>a, <uint64_t*>b, n, op)


cdef double _now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef int _wait(int n, MPI_Request* reqs, MPI_Status* statuses, double deadline) noexcept nogil:
    """Waitall, or Testall until ``deadline`` (< 0: none). 0 done, 1 timed out, else MPI code."""
    cdef int flag = 0, err, polls = 0
    cdef timespec pause
    cdef double sleep = 2e-5
    if deadline < 0:
        return MPI_Waitall(n, reqs, statuses)
    while True:
        err = MPI_Testall(n, reqs, &flag, statuses)
        if err != MPI_SUCCESS or flag:
            return err
        polls += 1
        if polls > 2000:
            if _now() >= deadline:
                return 1 if err == MPI_SUCCESS else err
            pause.tv_sec = 0
            pause.tv_nsec = <long>(sleep * 1e9)
            nanosleep(&pause, NULL)
            sleep = sleep * 2 if sleep < 1e-3 else 1e-3


def execute(Comm comm, const int64_t[:, ::1] steps, const int64_t[:, ::1] xfers,
            const int64_t[:, ::1] ops, Py_ssize_t input_address, Py_ssize_t output_address,
            Py_ssize_t scratch_address, int itemsize, int dtype, int op, int tag,
            double timeout):
    """Run the flattened plan. Returns None, or (step, kind, peer, detail) describing the
    failure, which compiled.py turns into the right exception."""
    cdef char* bases[3]
    bases[0] = <char*>input_address
    bases[1] = <char*>output_address
    bases[2] = <char*>scratch_address
    cdef MPI_Comm handle = comm.ob_mpi
    cdef Py_ssize_t n_steps = steps.shape[0], s, k, j, x = 0, o = 0
    cdef int n_recv, n_send, n_local, n_req, err = 0, count = 0, failed_at = -1, kind = 0
    cdef int peer = -1, detail = 0, cls = 0
    cdef int widest = 1
    for s in range(n_steps):
        if steps[s, 0] + steps[s, 1] > widest:
            widest = <int>(steps[s, 0] + steps[s, 1])
    cdef MPI_Request* reqs = <MPI_Request*>malloc(widest * sizeof(MPI_Request))
    cdef MPI_Status* statuses = <MPI_Status*>malloc(widest * sizeof(MPI_Status))
    if reqs == NULL or statuses == NULL:
        free(reqs); free(statuses)
        raise MemoryError()
    cdef double deadline = -1.0
    with nogil:
        if timeout >= 0:
            deadline = _now() + timeout
        for s in range(n_steps):
            n_recv = <int>steps[s, 0]
            n_send = <int>steps[s, 1]
            n_local = <int>steps[s, 2]
            n_req = n_recv + n_send
            for k in range(n_req):
                j = x + k
                if k < n_recv:
                    err = MPI_Irecv(bases[xfers[j, 1]] + xfers[j, 2] * itemsize,
                                    <int>(xfers[j, 3] * itemsize), MPI_BYTE, <int>xfers[j, 0],
                                    tag, handle, &reqs[k])
                else:
                    err = MPI_Isend(bases[xfers[j, 1]] + xfers[j, 2] * itemsize,
                                    <int>(xfers[j, 3] * itemsize), MPI_BYTE, <int>xfers[j, 0],
                                    tag, handle, &reqs[k])
                if err != MPI_SUCCESS:
                    failed_at = <int>s; kind = 2; peer = <int>xfers[j, 0]; detail = err
                    n_req = k          # only the posted ones are waited for below
                    break
            if failed_at < 0 and n_req:
                err = _wait(n_req, reqs, statuses, deadline)
                if err == 1:
                    failed_at = <int>s; kind = 1
                    for k in range(n_recv):   # a late message must not land in freed memory
                        MPI_Cancel(&reqs[k])
                        MPI_Wait(&reqs[k], MPI_STATUS_IGNORE)
                elif err != MPI_SUCCESS:
                    failed_at = <int>s; kind = 2; detail = err
                    for k in range(n_req):
                        if statuses[k].MPI_ERROR != MPI_SUCCESS:
                            peer = <int>xfers[x + k, 0]; detail = statuses[k].MPI_ERROR
                            break
                else:
                    for k in range(n_recv):   # a shorter message is a mismatch, not garbage
                        MPI_Get_count(&statuses[k], MPI_BYTE, &count)
                        if count != xfers[x + k, 3] * itemsize:
                            failed_at = <int>s; kind = 3; peer = <int>xfers[x + k, 0]
                            detail = count
                            break
            elif failed_at >= 0 and n_req:
                MPI_Waitall(n_req, reqs, MPI_STATUS_IGNORE)
            if failed_at >= 0:
                break
            x += n_recv + n_send
            for k in range(n_local):
                j = o + k
                if ops[j, 0] == 0:
                    memmove(bases[ops[j, 1]] + ops[j, 2] * itemsize,
                            bases[ops[j, 3]] + ops[j, 4] * itemsize, ops[j, 7] * itemsize)
                else:
                    _reduce(dtype, op, bases[ops[j, 1]] + ops[j, 2] * itemsize,
                            bases[ops[j, 3]] + ops[j, 4] * itemsize,
                            bases[ops[j, 5]] + ops[j, 6] * itemsize, ops[j, 7])
            o += n_local
    free(reqs)
    free(statuses)
    if failed_at < 0:
        return None
    if kind == 2:
        MPI_Error_class(detail, &cls)
        return (failed_at, "mpi", peer, cls)
    return (failed_at, "timeout" if kind == 1 else "size", peer, detail)
