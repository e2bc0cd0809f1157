# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled repeat path of a peer-memory group: a call shaped like one that already ran
(same collective, dtypes, sizes, op, algorithm, root, timeout), on plain arrays, launched
from here. At small sizes a call's time is the host's, and the Python path
(``ProcessGroup.prepare`` then its ``run`` then ``PeerExecutor.__call__``) spends several
times the driver's launch working out again what this path keeps ready: the key, the
checks of the buffers, the packed values (``tools/host_profile.py --parts`` splits a call's
time; BENCHMARKS.md has the figures). With ``launch_ex`` (cuLaunchKernelEx) each kernel may start
while the previous one on its stream finishes (COLLECTIVES_PEER_OVERLAP), which hides part
of the launch behind the kernel before it.

It decides nothing of its own. The group registers each call shape its Python path worked
out (``ProcessGroup._remember``), with the plans that path runs; a call then takes the same
plan, the same executor entry and the same kernel parameters the Python path would, and
advances the group's call sequence as it does. Where anything is not as it was when the
shape and the entry were made, or is unusual (a buffer that is not a flat contiguous array
of the group's type, input and output overlapping in part, another stream than the last
call's, the staging memory moved, a changed timeout, an error reported, DETAIL debugging, a
concurrent caller, another executor swapped in), the call takes the Python path instead,
which handles it or raises. So the two paths cannot disagree on anything but speed; tests
compare the kernel parameters of both (tests/local/test_peer_lane.py).

Limits: calls of the peer-memory executor only (GPUs of one host); no barrier, no AVG (its
final division is a host-side step), no calls with explicit counts.
"""
from libc.stdint cimport int32_t, uint64_t, uintptr_t

from threading import get_ident

from .. import settings
from ..ops import ReduceOp
from .peer import _SEEDED          # the collectives whose input seeds output

ctypedef int (*launch_t)(void* function, unsigned gx, unsigned gy, unsigned gz,
                         unsigned bx, unsigned by, unsigned bz, unsigned shared,
                         void* stream, void** params, void** extra) noexcept nogil

# cuLaunchKernelEx and its CUlaunchConfig / CUlaunchAttribute (cuda.h), for programmatic
# dependent launch: the kernel may start while the previous one on the stream finishes
ctypedef struct LaunchAttribute:
    int id
    int pad
    unsigned long long value[8]     # a 64-byte union; this attribute's value: its first int
ctypedef struct LaunchConfig:
    unsigned grid_x, grid_y, grid_z, block_x, block_y, block_z, shared
    void* stream
    LaunchAttribute* attrs
    unsigned n_attrs
ctypedef int (*launch_ex_t)(LaunchConfig* config, void* function, void** params,
                            void** extra) noexcept nogil
cdef enum:
    PROGRAMMATIC_STREAM_SERIALIZATION = 6     # CU_LAUNCH_ATTRIBUTE_...

# The executor's kernel parameters (executors/peer.py, _Entry.values): the ones a call sets.
cdef enum:
    IN_VALUE = 3
    OUT_VALUE = 4
    CALLER_OUT_VALUE = 6
    PLACE_VALUE = 20



cdef object _cupy_like = None      # an array type whose contiguity is an attribute of its
                                   # own and that has no read-only arrays (CuPy's ndarray)


cdef inline bint _plain(object buf, object array_type, bint written):
    """group._plain: None, or a flat contiguous array of the group's type. CuPy's ``flags``
    builds an object on every call and has no ``writeable`` (its arrays always are; asking
    raises an AttributeError inside getattr, dearer still), both on every call of this
    path: for such a type its ``_c_contiguous`` is read instead."""
    global _cupy_like
    if buf is None:
        return True
    cls = type(buf)
    if cls is not array_type or buf.ndim != 1:
        return False
    if cls is _cupy_like:
        return buf._c_contiguous
    flags = buf.flags
    if not flags.c_contiguous:
        return False
    if hasattr(flags, "writeable"):
        return not written or flags.writeable
    if hasattr(buf, "_c_contiguous"):
        _cupy_like = cls
    return True


cdef class _Launch:
    """One executor entry as the lane launches it: the entry (for its layout and timeout),
    the driver handles and where its four per-call values live."""
    cdef object entry
    cdef void* function
    cdef unsigned blocks
    cdef void** params
    cdef bint staged
    cdef uint64_t* values[4]

    def __cinit__(self, entry):
        import ctypes
        self.entry = entry
        self.function = <void*><uintptr_t>entry.function
        self.blocks = entry.blocks
        self.params = <void**><uintptr_t>entry.params
        self.staged = entry.staged
        for i, at in enumerate((IN_VALUE, OUT_VALUE, CALLER_OUT_VALUE, PLACE_VALUE)):
            self.values[i] = <uint64_t*><uintptr_t>ctypes.addressof(entry.values[at])


cdef class _Shape:
    """A call shape the group registered: its _Shape (plans, dtype, op, deadline, ...), the
    launches found for it, and its all_reduce plan that reads input (asked once)."""
    cdef readonly object shape
    cdef dict launches          # (id(plan), seeded, symmetric) -> _Launch
    cdef object direct
    cdef bint asked

    def __cinit__(self, shape):
        self.shape = shape
        self.launches = {}
        self.direct = None
        self.asked = False

    cdef object reading_input_first(self):
        if not self.asked:
            self.direct = self.shape.reading_input_first()
            self.asked = True
        return self.direct


cdef class Lane:
    """The repeat path of ``group``, whose executor is ``executor`` (a PeerExecutor).
    ``launch``: the address of ``cuLaunchKernel`` (tests pass a recorder's); ``launch_ex``:
    of ``cuLaunchKernelEx``, or 0: with it each launch lets the kernel start while the
    previous one on the stream finishes (the kernel waits for it where it must)."""
    cdef object group, executor, memory, array_type, level, get_stream, elsewhere
    cdef dict shapes
    cdef launch_t launch
    cdef launch_ex_t launch_ex
    cdef LaunchConfig config
    cdef LaunchAttribute overlap
    cdef unsigned threads
    cdef object words
    cdef int32_t* word
    cdef public long launched           # calls launched from here (tests, host_profile)
    # the previous call's key, field by field, and its shape: a call like it (each field the
    # same object, or the same size) skips building and hashing the key, which costs
    # more than comparing the fields (tools/host_profile.py --parts)
    cdef object last_collective, last_root, last_op, last_algorithm, last_timeout
    cdef object last_deadline, last_in_dtype, last_out_dtype, last_found
    cdef Py_ssize_t last_in_size, last_out_size

    def __cinit__(self, group, executor, uintptr_t launch, unsigned threads, get_stream,
                  elsewhere, uintptr_t launch_ex=0):
        self.group = group
        self.executor = executor
        self.memory = executor.memory
        self.array_type = group._array_type
        self.level = settings.DEBUG
        self.get_stream = get_stream
        self.elsewhere = elsewhere          # the executor's class of entries it hands on
        self.shapes = {}
        self.launch = <launch_t>launch
        self.launch_ex = <launch_ex_t>launch_ex
        self.overlap.id = PROGRAMMATIC_STREAM_SERIALIZATION
        self.overlap.value[0] = 1
        self.config.grid_y = self.config.grid_z = 1
        self.config.block_x, self.config.block_y, self.config.block_z = threads, 1, 1
        self.config.shared = 0
        self.config.attrs = &self.overlap
        self.config.n_attrs = 1
        self.threads = threads
        self.words = None
        self.launched = 0
        self.last_found = None

    def remember(self, key, shape):
        """Register a call shape the group's Python path worked out under ``key`` (its repeat
        key); shapes the lane never runs are left out."""
        if key is None or shape.plan is None or shape.collective == "barrier" or \
                shape.dtype is None or shape.op == ReduceOp.AVG or shape.extra:
            return
        self.shapes[key] = _Shape(shape)
        self.last_found = None

    def clear(self):
        self.shapes.clear()
        self.last_found = None

    def prepare(self, caller, collective, input, output, counts, root, op, algorithm, timeout):
        """``run`` for this call as ProcessGroup.prepare would return it, or None: take the
        Python path. ``caller``: the group calling (a copy of the group made with its
        ``__dict__``, as the bench's send/recv twin, is not this lane's)."""
        cdef _Shape known
        cdef bint seeded = False
        group = self.group
        if caller is not group or counts is not None or group._broken is not None or \
                group.execute is not self.executor or output is None:
            return None
        cdef Py_ssize_t in_size = -1, out_size
        try:
            in_dtype = None
            if input is not None:
                in_dtype, in_size = input.dtype, input.size
            out_dtype, out_size = output.dtype, output.size
            deadline = group.timeout
            found = self.last_found
            if found is None or collective is not self.last_collective or \
                    op is not self.last_op or algorithm is not self.last_algorithm or \
                    in_dtype is not self.last_in_dtype or in_size != self.last_in_size or \
                    out_dtype is not self.last_out_dtype or out_size != self.last_out_size or \
                    root is not self.last_root or timeout is not self.last_timeout or \
                    deadline is not self.last_deadline:
                key = (collective, root, op, algorithm, timeout, deadline,
                       None if input is None else (in_dtype, in_size), (out_dtype, out_size))
                found = self.shapes.get(key)
                if found is not None:
                    self.last_collective, self.last_root, self.last_op = collective, root, op
                    self.last_algorithm, self.last_timeout = algorithm, timeout
                    self.last_deadline, self.last_in_dtype = deadline, in_dtype
                    self.last_in_size, self.last_out_dtype = in_size, out_dtype
                    self.last_out_size, self.last_found = out_size, found
        except (AttributeError, TypeError):
            return None
        if found is None or self.level() == "DETAIL":
            return None
        array_type = self.array_type
        if not (_plain(input, array_type, False) and _plain(output, array_type, True)):
            return None
        known = <_Shape>found
        shape = known.shape
        plan = shape.steps
        if input is not None:
            if output.size == 0 or input.size == 0:
                return None
            a, b = input.data.ptr, output.data.ptr
            if a < b + output.nbytes and b < a + input.nbytes:      # they overlap
                if collective not in _SEEDED or a != b or input.size != output.size:
                    return None
                input = None            # the same memory: the plan runs on output alone
            elif collective in _SEEDED:
                seeded = True           # the kernel reads input where output is unwritten
                if collective == "all_reduce":   # the shape works it out once
                    direct = known.reading_input_first()
                    if direct is not None:
                        plan = direct
        gate = group._gate
        if not gate.acquire(False):
            return None                 # another caller inside: the Python path says so
        try:
            group._caller = (get_ident(), collective)
            tag = group.next_tag()
        finally:
            group._caller = None
            gate.release()
        return _Call(self, known, plan, input, output, seeded, tag)

    cdef bint run(self, _Shape known, object plan, object input, object output,
                  bint seeded) except -1:
        """Launch ``plan`` as PeerExecutor.__call__ would; False where it must do it."""
        cdef _Launch launch
        cdef uintptr_t out, stream_ptr
        cdef int rc
        executor = self.executor
        if executor.failed is not None:
            return False
        memory = self.memory
        words = memory.words
        if words is not self.words:
            if words is None:
                return False
            import ctypes
            self.words = words
            self.word = <int32_t*><uintptr_t>ctypes.addressof(words)
        if self.word[0] != 0:
            return False
        place = memory.place(output) if memory.heaps else 0
        shape = known.shape
        key = (id(plan), seeded, place != 0)
        found = known.launches.get(key)
        if found is None:
            held = executor._entries.get((id(plan), shape.dtype, shape.op, seeded, place != 0))
            if held is None or held[0] is not plan or type(held[1]) is self.elsewhere or \
                    held[1].finish is not None:     # copies between two launches: Python's
                return False
            found = known.launches[key] = _Launch(held[1])
        launch = <_Launch>found
        entry = launch.entry
        if entry.layout is not memory.layout or entry.timeout != shape.deadline:
            del known.launches[key]     # the Python path fits it (or makes a new one)
            return False
        stream = self.get_stream()
        last = memory.last_stream
        if last is not stream and last is not None and last.ptr != stream.ptr:
            return False
        out = output.data.ptr
        stream_ptr = stream.ptr
        memory.last_stream = stream
        launch.values[3][0] = <uint64_t>place
        launch.values[0][0] = 0 if input is None else <uint64_t><uintptr_t>input.data.ptr
        launch.values[1][0] = <uint64_t><uintptr_t>memory.data_ptr if launch.staged else out
        launch.values[2][0] = out
        if self.launch_ex != NULL:
            self.config.grid_x = launch.blocks
            self.config.stream = <void*>stream_ptr
            with nogil:
                rc = self.launch_ex(&self.config, launch.function, launch.params, NULL)
        else:
            with nogil:
                rc = self.launch(launch.function, launch.blocks, 1, 1, self.threads, 1, 1, 0,
                                 <void*>stream_ptr, launch.params, NULL)
        if rc != 0:
            return False                # the Python path launches again and raises CuPy's error
        self.launched += 1
        return True


cdef class _Call:
    """``run()`` of one call: claims the group as the Python run does, launches, or hands
    the call to the group's executor exactly as the Python run would."""
    cdef Lane lane
    cdef _Shape known
    cdef object plan, input, output, tag
    cdef bint seeded

    def __cinit__(self, Lane lane, _Shape known, plan, input, output, bint seeded, tag):
        self.lane, self.known, self.plan = lane, known, plan
        self.input, self.output, self.seeded, self.tag = input, output, seeded, tag

    def __call__(self):
        cdef Lane lane = self.lane
        cdef bint took = False
        group = lane.group
        shape = self.known.shape
        collective = shape.collective
        me = get_ident()
        if me == group.async_thread:
            pass
        elif group._broken is None and group._gate.acquire(False):
            group._caller = (me, collective)
            took = True
        else:
            took = group._enter(collective)
        try:
            if not lane.run(self.known, self.plan, self.input, self.output, self.seeded):
                # the buffers as the Python run passes them (input never overlaps output
                # here; None where it is output itself)
                buffers = group._buffers(collective, self.input, self.output)
                group.execute(self.plan, group.transport, buffers, shape.reduce, tag=self.tag,
                              timeout=shape.deadline, operation=collective, dtype=shape.dtype,
                              op=shape.op)
        finally:
            if took:
                group._caller = None
                group._gate.release()
