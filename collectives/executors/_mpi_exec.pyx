# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled executor for the MPI transport: interprets a lowered program in C.

One call per collective instead of one Python round trip per step: MPI_Irecv/MPI_Isend
straight from the program's arrays, a Testall loop with a deadline, then copies and reductions
as C loops, all without the GIL. The program is ``algorithms.lowered``'s (the step walk, or
any other lowering: the overlapped one runs here too), so what runs is what the host executor,
its twin (``collectives.executors.host.execute``), the simulator and the cost model walk; the
tests hold the two executors to the same bits.

The program arrives flattened by ``compiled.py`` into a ``FlatProgram`` (C arrays, built once
per program; buffers: 0 input, 1 output, 2 scratch). Requests live in *slots*: a slot is free
again once its request was waited for, so a call needs as many as the program has requests in
flight at once (the step walk: its widest step), on the stack for common plans.
    code   (n_code, 5)    kind (0 post, 1 wait, 2 local), plan step, first row, rows, and for
                          a wait the first of its slots when they are consecutive (else -1)
    xfers  (n_xfers, 6)   is receive, peer, buffer, offset, count, slot   (posting order)
    waits  (n_waits, 4)   slot, is receive, peer, count
    ops    (n_ops, 8)     kind (0 copy, 1 reduce), dst buffer, dst offset, a buffer, a offset,
                          b buffer, b offset, count
Offsets and counts are in elements; ``itemsize`` turns them into bytes. A call costs little
Python (argument parsing, three data pointers) on top of the MPI work. The C that Cython cannot
write (float16/bfloat16 reductions with SIMD, the MPI family macros) is in ``_mpi_exec.h``.

A signed call (a ``Signing``: the transport folds the call's signature into the tag's top
bits) tags its messages so, and its slow waits look for messages of its tag with other
signature bits, as the transport's own waits do (``transports/mpi.py``): another call's, or a
notice from a rank that left the call.
"""
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, free
from libc.string cimport memmove
from posix.time cimport clock_gettime, CLOCK_MONOTONIC, timespec, nanosleep

from mpi4py.libmpi cimport (MPI_Comm, MPI_Request, MPI_Status, MPI_Isend, MPI_Irecv,
                            MPI_Testall, MPI_Cancel, MPI_Wait, MPI_Get_count, MPI_Iprobe,
                            MPI_Request_free, MPI_REQUEST_NULL, MPI_ANY_SOURCE, MPI_ANY_TAG,
                            MPI_BYTE, MPI_SUCCESS, MPI_STATUS_IGNORE, MPI_Error_class,
                            MPI_ERR_PENDING, MPI_ERR_TRUNCATE)
from mpi4py.MPI cimport Comm

cdef extern from "_mpi_exec.h":
    const char* COLLECTIVES_MPI_FAMILY

    # float16 / bfloat16 reductions: widened to float32, rounded once to nearest even (the
    # bits numpy and ml_dtypes give), with AVX-512 / F16C / AVX2 loops picked at run time
    void coll_reduce_f16(int op, uint16_t* d, const uint16_t* a, const uint16_t* b,
                         Py_ssize_t n) noexcept nogil
    void coll_reduce_bf16(int op, uint16_t* d, const uint16_t* a, const uint16_t* b,
                          Py_ssize_t n) noexcept nogil
    int coll_f16_path       # -1 the best the CPU has, 0 portable C, 1 at most F16C / AVX2

    # numpy's data pointer read straight from the object, as PyArray_DATA does
    char* coll_ndarray_data(object array)

BUILT_FOR = COLLECTIVES_MPI_FAMILY.decode()
ERR_TRUNCATE = MPI_ERR_TRUNCATE         # the error class of a message larger than its receive

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
DEF F16 = 10
DEF BF16 = 11
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
    """dst = a op b for SUM/PRODUCT/MIN/MAX; MIN/MAX as numpy's minimum/maximum on float32/64:
    a NaN in a wins, then a NaN in b, and on ties (0.0 vs -0.0) b is returned."""
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
                dst[i] = x if (_isnan(x) or x < y) else y
            else:
                dst[i] = x if x <= y else y
    elif op == MAX:
        for i in range(n):
            x = a[i]; y = b[i]
            if number is float or number is double:
                dst[i] = x if (_isnan(x) or x > y) else y
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
    elif dtype == F16:
        coll_reduce_f16(op, <uint16_t*>dst, <uint16_t*>a, <uint16_t*>b, n)
    elif dtype == BF16:
        coll_reduce_bf16(op, <uint16_t*>dst, <uint16_t*>a, <uint16_t*>b, n)


cdef double _now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef extern from "<sched.h>" nogil:
    int sched_yield()

# Waiting: Testall in a loop. MPICH's blocking MPI_Waitall is several times slower per small
# exchange step than a Testall loop, so even without a deadline we poll. Spin first (most
# steps finish within microseconds), then yield the CPU (oversubscribed ranks must let their
# peers run), and only after a whole second (a peer that is late, not a message in flight)
# sleep with a short growing backoff. MPI makes no progress while we sleep: Open MPI moves a
# large shared-memory message in fragments, each needing a poll on both sides, so sleeping
# early stalls large messages many times over.
# A signed call's wait that has not finished after PROBE_AFTER seconds looks for another
# call's messages (then every PROBE_EVERY, and at the deadline): the transport's _PROBE_AFTER.
DEF SPIN_POLLS = 64
DEF YIELD_SECONDS = 1.0
DEF FIRST_SLEEP = 2e-5
DEF MAX_SLEEP = 2e-4
DEF PROBE_AFTER = 5e-3
DEF PROBE_EVERY = 5e-3
DEF TIMED_OUT = -1          # _wait's results besides MPI's codes (which are never negative)
DEF FOREIGN = -2


cdef struct Probe:
    MPI_Comm comm
    int base            # the call's tag without its signature bits
    int mine            # its signature bits
    int shift
    int values          # 2**width; 0: the call is unsigned, nothing to look for
    int source          # what was found
    int tag


cdef bint _foreign(Probe* p) noexcept nogil:
    """Whether a message of this call's tag with other signature bits has arrived (another
    call's, or a notice); its sender and MPI tag go into ``p``."""
    cdef int flag = 0, value
    cdef MPI_Status status
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, p.comm, &flag, &status)
    if not flag:
        return False                # the usual case: nothing unreceived at all
    for value in range(p.values):
        if value != p.mine:
            MPI_Iprobe(MPI_ANY_SOURCE, p.base | (value << p.shift), p.comm, &flag, &status)
            if flag:
                p.source = status.MPI_SOURCE
                p.tag = status.MPI_TAG
                return True
    return False


cdef int _wait(int n, MPI_Request* reqs, MPI_Status* statuses, double deadline,
               Probe* probe) noexcept nogil:
    """Testall until done, or until ``deadline`` (< 0: none). 0 done, TIMED_OUT, FOREIGN (a
    signed call found another call's message: ``probe`` says whose), else MPI's code."""
    cdef int flag = 0, err, polls = 0
    cdef timespec pause
    cdef double sleep = FIRST_SLEEP, start = -1.0, now, look_at = -1.0
    while True:
        err = MPI_Testall(n, reqs, &flag, statuses)
        if err != MPI_SUCCESS or flag:
            return err
        polls += 1
        if polls < SPIN_POLLS:
            continue
        now = _now()
        if start < 0:
            start = now
            look_at = now + PROBE_AFTER
        if probe.values and now >= look_at:
            if _foreign(probe):
                return FOREIGN
            look_at = now + PROBE_EVERY
        if deadline >= 0 and now >= deadline:
            if probe.values and _foreign(probe):    # a mismatch says more than a timeout
                return FOREIGN
            return TIMED_OUT
        if now - start < YIELD_SECONDS:
            sched_yield()
        else:
            pause.tv_sec = 0
            pause.tv_nsec = <long>(sleep * 1e9)
            nanosleep(&pause, NULL)
            sleep = sleep * 2 if sleep < MAX_SLEEP else MAX_SLEEP


DEF POST = 0
DEF WAIT = 1
DEF LOCAL = 2


cdef class FlatProgram:
    """One lowered program as C arrays, built once (``compiled.py`` caches it); the table
    layouts are in the module's docstring."""
    cdef int64_t* code
    cdef int64_t* xfers
    cdef int64_t* waits
    cdef int64_t* ops
    cdef readonly Py_ssize_t n_code
    cdef readonly int slots             # most requests in flight at once
    cdef readonly int gather            # most requests of a wait whose slots are not consecutive
    cdef readonly Py_ssize_t largest    # elements in the largest message

    def __cinit__(self, code, xfers, waits, ops, int slots, int gather):
        self.n_code = len(code)
        self.code = _table(code, 5)
        self.xfers = _table(xfers, 6)
        self.waits = _table(waits, 4)
        self.ops = _table(ops, 8)
        self.slots = max(1, slots)
        self.gather = gather
        self.largest = 0
        for row in xfers:
            self.largest = max(self.largest, row[4])

    def __dealloc__(self):
        free(self.code)
        free(self.xfers)
        free(self.waits)
        free(self.ops)


cdef int64_t* _table(rows, int width) except NULL:
    cdef int64_t* out = <int64_t*>malloc(max(1, len(rows)) * width * sizeof(int64_t))
    cdef Py_ssize_t r, c
    if out == NULL:
        raise MemoryError()
    for r, row in enumerate(rows):
        if len(row) != width:
            free(out)
            raise ValueError(f"program table row {row!r} does not have {width} fields")
        for c in range(width):
            out[r * width + c] = row[c]
    return out


cdef char* _data(object array) except? NULL:
    """The first byte of a flat contiguous array: for ndarrays numpy's own ``data`` field (the
    first after the object header; what PyArray_DATA reads), saving the dictionary that
    ``__array_interface__`` builds per buffer; anything else through that interface."""
    if array is None:
        return NULL
    if isinstance(array, _ndarray):
        return coll_ndarray_data(array)
    return <char*><Py_ssize_t>array.__array_interface__["data"][0]


from numpy import ndarray as _ndarray

# Requests (and their statuses) of one call on the stack up to this many slots
DEF STACK_REQUESTS = 32


cdef void _abandon(int slots, MPI_Request* reqs, const char* receiving) noexcept nogil:
    """Give up every request still pending after a failure: a receive is cancelled and
    completed (a late message must not land in memory the caller frees), a send is left to
    MPI (it may be matched later; MPI owns it now)."""
    cdef int k
    for k in range(slots):
        if reqs[k] != MPI_REQUEST_NULL:
            if receiving[k]:
                MPI_Cancel(&reqs[k])
                MPI_Wait(&reqs[k], MPI_STATUS_IGNORE)
            else:
                MPI_Request_free(&reqs[k])


cdef class Signing:
    """How one call signature goes into a tag: its bits in place (``mark``), in the top
    ``bits`` bits from bit ``shift`` (the transport's ``signature_mark``, ``signature_shift``,
    ``signature_width``); made once per signature."""
    cdef readonly int mark, shift, bits

    def __cinit__(self, int mark, int shift, int bits):
        # MPI tags are C ints: the mark's bits end below bit 31
        if not (0 < bits and 0 < shift and shift + bits <= 31 and mark > 0
                and mark & ((1 << shift) - 1) == 0):
            raise ValueError(f"Signing: mark {mark:#x} is not {bits} bits from bit {shift}")
        self.mark, self.shift, self.bits = mark, shift, bits


def execute(FlatProgram program, Comm comm, input, output, scratch, int itemsize, int dtype,
            int op, int tag, double timeout, Signing signing=None):
    """Run the flattened program on the arrays (None where a plan does not use one), its
    messages tagged ``tag`` (with the call's signature folded in where ``signing`` is given).
    Returns None, or (step, kind, peer, detail, bytes the failed receive expected) describing
    the failure, which compiled.py turns into the right exception (kind "mpi": detail is the
    error class; "size": the bytes that came; "foreign": the MPI tag found)."""
    cdef char* bases[3]
    bases[0] = _data(input)
    bases[1] = _data(output)
    bases[2] = _data(scratch)
    cdef MPI_Comm handle = comm.ob_mpi
    cdef const int64_t* code = program.code
    cdef const int64_t* xfers = program.xfers
    cdef const int64_t* waits = program.waits
    cdef const int64_t* ops = program.ops
    cdef const int64_t* row
    cdef const int64_t* t
    cdef const int64_t* w
    cdef const int64_t* c
    cdef Py_ssize_t n_code = program.n_code, pc, k
    cdef int slots = program.slots, width = program.slots + program.gather
    cdef int n, first, slot, err = 0, count = 0, failed_at = -1, kind = 0
    cdef int peer = -1, detail = 0, cls = 0
    cdef Py_ssize_t expected = 0        # bytes of the receive that failed
    cdef Probe probe
    probe.comm = handle
    probe.values = probe.shift = probe.base = probe.mine = probe.source = probe.tag = 0
    if signing is not None:
        probe.shift = signing.shift
        probe.base = tag & ((1 << signing.shift) - 1)
        probe.mine = signing.mark >> signing.shift
        probe.values = 1 << signing.bits
        tag = probe.base | signing.mark
    cdef MPI_Request stack_reqs[STACK_REQUESTS]
    cdef MPI_Status stack_statuses[STACK_REQUESTS]
    cdef char stack_receiving[STACK_REQUESTS]
    cdef MPI_Request* reqs = stack_reqs
    cdef MPI_Status* statuses = stack_statuses
    cdef char* receiving = stack_receiving
    cdef MPI_Request* waited
    cdef MPI_Status* status
    if width > STACK_REQUESTS:
        reqs = <MPI_Request*>malloc(width * sizeof(MPI_Request))
        statuses = <MPI_Status*>malloc(width * sizeof(MPI_Status))
        receiving = <char*>malloc(width)
        if reqs == NULL or statuses == NULL or receiving == NULL:
            free(reqs); free(statuses); free(receiving)
            raise MemoryError()
    cdef double deadline = -1.0
    with nogil:
        for k in range(slots):
            reqs[k] = MPI_REQUEST_NULL
        if timeout >= 0:
            deadline = _now() + timeout
        for pc in range(n_code):
            row = code + 5 * pc
            first = <int>row[2]
            n = <int>row[3]
            if row[0] == POST:
                for k in range(n):
                    t = xfers + 6 * (first + k)
                    slot = <int>t[5]
                    receiving[slot] = <char>t[0]
                    if t[0]:
                        err = MPI_Irecv(bases[t[2]] + t[3] * itemsize, <int>(t[4] * itemsize),
                                        MPI_BYTE, <int>t[1], tag, handle, &reqs[slot])
                    else:
                        err = MPI_Isend(bases[t[2]] + t[3] * itemsize, <int>(t[4] * itemsize),
                                        MPI_BYTE, <int>t[1], tag, handle, &reqs[slot])
                    if err != MPI_SUCCESS:
                        reqs[slot] = MPI_REQUEST_NULL
                        failed_at = <int>row[1]; kind = 2; peer = <int>t[1]; detail = err
                        break
            elif row[0] == WAIT:
                w = waits + 4 * first
                if row[4] >= 0:             # consecutive slots: wait on them in place
                    waited = reqs + row[4]
                    status = statuses + row[4]
                else:                       # else gathered past the slots, and put back
                    waited = reqs + slots
                    status = statuses + slots
                    for k in range(n):
                        waited[k] = reqs[w[4 * k]]
                err = _wait(n, waited, status, deadline, &probe)
                if row[4] < 0 and err >= 0:
                    for k in range(n):
                        reqs[w[4 * k]] = waited[k]
                if err == TIMED_OUT:
                    failed_at = <int>row[1]; kind = 1
                elif err == FOREIGN:
                    failed_at = <int>row[1]; kind = 4; peer = probe.source; detail = probe.tag
                elif err != MPI_SUCCESS:
                    failed_at = <int>row[1]; kind = 2; detail = err
                    for k in range(n):      # the request that failed, not one still pending
                        if status[k].MPI_ERROR != MPI_SUCCESS:
                            MPI_Error_class(status[k].MPI_ERROR, &cls)
                            if cls != MPI_ERR_PENDING:
                                peer = <int>w[4 * k + 2]; detail = status[k].MPI_ERROR
                                expected = w[4 * k + 3] * itemsize
                                break
                else:
                    for k in range(n):      # a shorter message is a mismatch, not garbage
                        if w[4 * k + 1]:
                            MPI_Get_count(&status[k], MPI_BYTE, &count)
                            if count != w[4 * k + 3] * itemsize:
                                failed_at = <int>row[1]; kind = 3; peer = <int>w[4 * k + 2]
                                detail = count; expected = w[4 * k + 3] * itemsize
                                break
            else:
                for k in range(n):
                    c = ops + 8 * (first + k)
                    if c[0] == 0:
                        memmove(bases[c[1]] + c[2] * itemsize, bases[c[3]] + c[4] * itemsize,
                                c[7] * itemsize)
                    else:
                        _reduce(dtype, op, bases[c[1]] + c[2] * itemsize,
                                bases[c[3]] + c[4] * itemsize, bases[c[5]] + c[6] * itemsize,
                                c[7])
            if failed_at >= 0:
                _abandon(slots, reqs, receiving)
                break
    if reqs != stack_reqs:
        free(reqs)
        free(statuses)
        free(receiving)
    if failed_at < 0:
        return None
    if kind == 2:
        MPI_Error_class(detail, &cls)
        return (failed_at, "mpi", peer, cls, expected)
    return (failed_at, "timeout" if kind == 1 else "size" if kind == 3 else "foreign", peer,
            detail, expected)


def reduce_array(int dtype, int op, dst, a, b, int path=-1):
    """dst = a op b through the executor's own C loops (dtype/op codes as in ``execute``), for
    tests and benchmarks. ``path`` picks the float16/bfloat16 code: -1 the best the CPU has
    (AVX-512, else F16C / AVX2), 1 at most F16C / AVX2, 0 the portable C. Arrays must be
    C-contiguous, of one itemsize and length; dst may be a or b."""
    cdef Py_ssize_t itemsize = dst.itemsize
    cdef const unsigned char[::1] va = a.reshape(-1).view("u1")
    cdef const unsigned char[::1] vb = b.reshape(-1).view("u1")
    cdef unsigned char[::1] vd = dst.reshape(-1).view("u1")
    cdef Py_ssize_t n = vd.shape[0] // itemsize
    if va.shape[0] != vd.shape[0] or vb.shape[0] != vd.shape[0]:
        raise ValueError("reduce_array: operands differ in size")
    if n == 0:
        return
    global coll_f16_path
    coll_f16_path = path
    with nogil:
        _reduce(dtype, op, <char*>&vd[0], <char*>&va[0], <char*>&vb[0], n)
    coll_f16_path = -1
