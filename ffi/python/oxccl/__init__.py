"""oxccl: a thin ctypes binding of oxccl's NCCL-compatible C ABI (libnccl.so.2).

Calls go through ctypes, which releases the GIL for the duration of each C call, so other
Python threads (autograd, data loading) keep running while a collective moves data.

The library is found, in order: ``$OXCCL_LIBRARY``; the copy bundled by ``pip install``
(``oxccl/lib/libnccl.so.2``); ``target/release/libnccl.so`` of the source tree this package sits
in (for development).
"""

import ctypes
import os
import pathlib

__all__ = [
    "Comm",
    "NcclError",
    "get_unique_id",
    "library_path",
    "version",
    "group",
    "DTYPES",
    "OPS",
]

# ncclResult_t
SUCCESS, IN_PROGRESS = 0, 7
RESULT_NAMES = {
    0: "ncclSuccess",
    1: "ncclUnhandledCudaError",
    2: "ncclSystemError",
    3: "ncclInternalError",
    4: "ncclInvalidArgument",
    5: "ncclInvalidUsage",
    6: "ncclRemoteError",
    7: "ncclInProgress",
    8: "ncclTimeout",
}
# ncclDataType_t by name
DTYPES = {
    "int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5,
    "float16": 6, "float32": 7, "float64": 8, "bfloat16": 9, "float8_e4m3": 10, "float8_e5m2": 11,
}
# ncclRedOp_t by name
OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
UNIQUE_ID_BYTES = 128


def library_path():
    """Where the library is loaded from."""
    env = os.environ.get("OXCCL_LIBRARY")
    if env:
        return env
    here = pathlib.Path(__file__).resolve().parent
    bundled = here / "lib" / "libnccl.so.2"
    if bundled.exists():
        return str(bundled)
    dev = here.parent.parent.parent / "target" / "release" / "libnccl.so"
    if dev.exists():
        return str(dev)
    raise OSError(
        "oxccl: libnccl.so.2 not found: install with `pip install ./ffi/python`, or set "
        "OXCCL_LIBRARY to oxccl's target/release/libnccl.so"
    )


class _UniqueId(ctypes.Structure):
    """ncclUniqueId: a 128-byte struct passed by value."""

    _fields_ = [("internal", ctypes.c_char * UNIQUE_ID_BYTES)]


_lib = None


def lib():
    """The loaded library (loaded on first use), with argument types declared."""
    global _lib
    if _lib is None:
        L = ctypes.CDLL(library_path())  # CDLL: the GIL is released during every call
        vp, sz, ci = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
        sigs = {
            "ncclGetVersion": [ctypes.POINTER(ci)],
            "ncclGetUniqueId": [ctypes.c_char_p],
            "ncclCommInitRank": [ctypes.POINTER(vp), ci, _UniqueId, ci],
            "oxcclCommInitRankTimeout": [ctypes.POINTER(vp), ci, _UniqueId, ci, ctypes.c_double],
            "ncclCommDestroy": [vp],
            "ncclCommAbort": [vp],
            "ncclCommFinalize": [vp],
            "ncclCommCount": [vp, ctypes.POINTER(ci)],
            "ncclCommUserRank": [vp, ctypes.POINTER(ci)],
            "ncclCommGetAsyncError": [vp, ctypes.POINTER(ci)],
            "ncclCommSplit": [vp, ci, ci, ctypes.POINTER(vp), vp],
            "ncclCommShrink": [vp, ctypes.POINTER(ci), ci, ctypes.POINTER(vp), vp, ci],
            "ncclCommRevoke": [vp, ci],
            "ncclCommGetUniqueId": [vp, ctypes.c_char_p],
            "ncclCommGrow": [vp, ci, ctypes.c_char_p, ci, ctypes.POINTER(vp), vp],
            "ncclCommSuspend": [vp, ci],
            "ncclCommResume": [vp],
            "ncclCommMemStats": [vp, ci, ctypes.POINTER(ctypes.c_uint64)],
            "ncclAllReduce": [vp, vp, sz, ci, ci, vp, vp],
            "ncclBroadcast": [vp, vp, sz, ci, ci, vp, vp],
            "ncclReduce": [vp, vp, sz, ci, ci, ci, vp, vp],
            "ncclAllGather": [vp, vp, sz, ci, vp, vp],
            "ncclReduceScatter": [vp, vp, sz, ci, ci, vp, vp],
            "ncclAlltoAll": [vp, vp, sz, ci, vp, vp],
            "ncclGather": [vp, vp, sz, ci, ci, vp, vp],
            "ncclScatter": [vp, vp, sz, ci, ci, vp, vp],
            "ncclSend": [vp, sz, ci, ci, vp, vp],
            "ncclRecv": [vp, sz, ci, ci, vp, vp],
            "oxcclRecvAny": [vp, sz, ci, ctypes.POINTER(ci), vp, vp],
            "oxcclUniqueIdDerive": [ctypes.c_char_p, ctypes.c_uint64, ctypes.c_char_p],
            "ncclGroupStart": [],
            "ncclGroupEnd": [],
            "ncclRedOpCreatePreMulSum": [ctypes.POINTER(ci), vp, ci, ci, vp],
            "ncclRedOpDestroy": [ci, vp],
        }
        for name, args in sigs.items():
            f = getattr(L, name)
            f.argtypes = args
            f.restype = ci
        L.ncclGetErrorString.argtypes = [ci]
        L.ncclGetErrorString.restype = ctypes.c_char_p
        L.ncclGetLastError.argtypes = [vp]
        L.ncclGetLastError.restype = ctypes.c_char_p
        _lib = L
    return _lib


class NcclError(RuntimeError):
    """A failed call: `code` is the ncclResult_t, the message oxccl's detailed text."""

    def __init__(self, code, call):
        L = lib()
        text = (L.ncclGetLastError(None) or b"").decode(errors="replace")
        name = RESULT_NAMES.get(code, str(code))
        super().__init__(f"{call}: {name}: {text or L.ncclGetErrorString(code).decode()}")
        self.code = code


def _check(code, call, allow_in_progress=False):
    if code == SUCCESS or (allow_in_progress and code == IN_PROGRESS):
        return code
    raise NcclError(code, call)


def version():
    """ncclGetVersion (an NCCL version code, e.g. 23203 for 2.32.3)."""
    v = ctypes.c_int()
    _check(lib().ncclGetVersion(ctypes.byref(v)), "ncclGetVersion")
    return v.value


def get_unique_id():
    """A new unique id (128 bytes); this process serves its rendezvous."""
    buf = ctypes.create_string_buffer(UNIQUE_ID_BYTES)
    _check(lib().ncclGetUniqueId(buf), "ncclGetUniqueId")
    return buf.raw


def derive_unique_id(unique_id, salt):
    """The id of a fresh job on ``unique_id``'s store (``oxcclUniqueIdDerive``): one per salt."""
    out = ctypes.create_string_buffer(UNIQUE_ID_BYTES)
    _check(lib().oxcclUniqueIdDerive(bytes(unique_id), salt & (2**64 - 1), out), "oxcclUniqueIdDerive")
    return out.raw


class group:
    """``with oxccl.group():`` - ncclGroupStart/ncclGroupEnd around the block."""

    def __enter__(self):
        _check(lib().ncclGroupStart(), "ncclGroupStart")
        return self

    def __exit__(self, *exc):
        code = lib().ncclGroupEnd()
        if exc[0] is None:
            _check(code, "ncclGroupEnd")
        return False


class Comm:
    """A communicator. Buffers are raw addresses (``int``: host memory, or device memory when
    ``stream`` is set to a CUDA stream handle) and element counts."""

    def __init__(self, handle):
        self.handle = ctypes.c_void_p(handle)
        #: The ``cudaStream_t`` (an ``int``) operations are enqueued on; ``None``: host buffers,
        #: completed before the call returns.
        self.stream = None

    @classmethod
    def init_rank(cls, nranks, unique_id, rank, timeout=None):
        """ncclCommInitRank: every rank of the communicator calls it with the same id.

        ``timeout`` (seconds): this communicator's bound on every wait, instead of
        ``OXCCL_TIMEOUT``'s (oxccl's ``oxcclCommInitRankTimeout``)."""
        if len(unique_id) != UNIQUE_ID_BYTES:
            raise ValueError(f"a unique id has {UNIQUE_ID_BYTES} bytes, got {len(unique_id)}")
        h = ctypes.c_void_p()
        uid = _UniqueId.from_buffer_copy(bytes(unique_id))
        if timeout is None:
            _check(lib().ncclCommInitRank(ctypes.byref(h), nranks, uid, rank), "ncclCommInitRank")
        else:
            code = lib().oxcclCommInitRankTimeout(ctypes.byref(h), nranks, uid, rank, float(timeout))
            _check(code, "oxcclCommInitRankTimeout")
        return cls(h.value)

    def _h(self):
        if not self.handle:
            raise NcclError(4, "communicator already destroyed")
        return self.handle

    def size(self):
        v = ctypes.c_int()
        _check(lib().ncclCommCount(self._h(), ctypes.byref(v)), "ncclCommCount")
        return v.value

    def rank(self):
        v = ctypes.c_int()
        _check(lib().ncclCommUserRank(self._h(), ctypes.byref(v)), "ncclCommUserRank")
        return v.value

    def async_error(self):
        v = ctypes.c_int()
        _check(lib().ncclCommGetAsyncError(self._h(), ctypes.byref(v)), "ncclCommGetAsyncError")
        return v.value

    def split(self, color, key):
        """ncclCommSplit; color None is NCCL_SPLIT_NOCOLOR (returns None)."""
        h = ctypes.c_void_p()
        c = -1 if color is None else color
        _check(lib().ncclCommSplit(self._h(), c, key, ctypes.byref(h), None), "ncclCommSplit")
        return Comm(h.value) if h.value else None

    # ---- fault tolerance (ncclCommShrink, ncclCommRevoke, ncclCommGrow, suspend) ----------

    def shrink(self, exclude, abort=False):
        """ncclCommShrink: a communicator of the ranks not in ``exclude`` (renumbered in order);
        only they call it. ``abort``: NCCL_SHRINK_ABORT (revoke what is outstanding first)."""
        arr = (ctypes.c_int * max(1, len(exclude)))(*exclude)
        h = ctypes.c_void_p()
        code = lib().ncclCommShrink(self._h(), arr, len(exclude), ctypes.byref(h), None, 1 if abort else 0)
        _check(code, "ncclCommShrink")
        return Comm(h.value)

    def revoke(self):
        """ncclCommRevoke: stop every operation here; True once nothing runs any more."""
        return _check(lib().ncclCommRevoke(self._h(), 0), "ncclCommRevoke", allow_in_progress=True) == SUCCESS

    def grow_id(self):
        """ncclCommGetUniqueId: the single-use id of the next grow, for the newcomers."""
        buf = ctypes.create_string_buffer(UNIQUE_ID_BYTES)
        _check(lib().ncclCommGetUniqueId(self._h(), buf), "ncclCommGetUniqueId")
        return buf.raw

    def grow(self, nranks, unique_id=None):
        """ncclCommGrow as a member (keeps its rank); ``unique_id`` only on the rank that made it."""
        h = ctypes.c_void_p()
        uid = None if unique_id is None else bytes(unique_id)
        _check(lib().ncclCommGrow(self._h(), nranks, uid, -1, ctypes.byref(h), None), "ncclCommGrow")
        return Comm(h.value)

    @classmethod
    def join_grow(cls, nranks, unique_id, rank):
        """ncclCommGrow as a newcomer: the id from a member, and one of the new ranks."""
        if len(unique_id) != UNIQUE_ID_BYTES:
            raise ValueError(f"a unique id has {UNIQUE_ID_BYTES} bytes, got {len(unique_id)}")
        h = ctypes.c_void_p()
        _check(lib().ncclCommGrow(None, nranks, bytes(unique_id), rank, ctypes.byref(h), None), "ncclCommGrow")
        return cls(h.value)

    def suspend(self):
        """ncclCommSuspend(NCCL_SUSPEND_MEM): release the connections until ``resume``."""
        _check(lib().ncclCommSuspend(self._h(), 1), "ncclCommSuspend")

    def resume(self):
        _check(lib().ncclCommResume(self._h()), "ncclCommResume")

    def mem_stats(self):
        """ncclCommMemStats: (bytes suspend releases, suspended)."""
        v = ctypes.c_uint64()
        _check(lib().ncclCommMemStats(self._h(), 0, ctypes.byref(v)), "ncclCommMemStats")
        b = v.value
        _check(lib().ncclCommMemStats(self._h(), 1, ctypes.byref(v)), "ncclCommMemStats")
        return b, bool(v.value)

    def all_reduce(self, send, recv, count, dtype, op):
        _check(lib().ncclAllReduce(send, recv, count, dtype, op, self._h(), self.stream), "ncclAllReduce")

    def broadcast(self, send, recv, count, dtype, root):
        _check(lib().ncclBroadcast(send, recv, count, dtype, root, self._h(), self.stream), "ncclBroadcast")

    def reduce(self, send, recv, count, dtype, op, root):
        _check(lib().ncclReduce(send, recv, count, dtype, op, root, self._h(), self.stream), "ncclReduce")

    def all_gather(self, send, recv, count, dtype):
        _check(lib().ncclAllGather(send, recv, count, dtype, self._h(), self.stream), "ncclAllGather")

    def reduce_scatter(self, send, recv, count, dtype, op):
        _check(lib().ncclReduceScatter(send, recv, count, dtype, op, self._h(), self.stream), "ncclReduceScatter")

    def all_to_all(self, send, recv, count, dtype):
        _check(lib().ncclAlltoAll(send, recv, count, dtype, self._h(), self.stream), "ncclAlltoAll")

    def gather(self, send, recv, count, dtype, root):
        _check(lib().ncclGather(send, recv, count, dtype, root, self._h(), self.stream), "ncclGather")

    def scatter(self, send, recv, count, dtype, root):
        _check(lib().ncclScatter(send, recv, count, dtype, root, self._h(), self.stream), "ncclScatter")

    def send(self, buf, count, dtype, peer):
        _check(lib().ncclSend(buf, count, dtype, peer, self._h(), self.stream), "ncclSend")

    def recv(self, buf, count, dtype, peer):
        _check(lib().ncclRecv(buf, count, dtype, peer, self._h(), self.stream), "ncclRecv")

    def recv_any(self, buf, count, dtype):
        """Receive from whichever rank sends to this one first (oxccl's ``oxcclRecvAny``);
        returns that rank. Host memory; blocks until received or the communicator's timeout."""
        src = ctypes.c_int(-1)
        _check(lib().oxcclRecvAny(buf, count, dtype, ctypes.byref(src), self._h(), self.stream), "oxcclRecvAny")
        return src.value

    def create_pre_mul_sum(self, scalar_addr, dtype):
        """ncclRedOpCreatePreMulSum with a host scalar read now; returns the op."""
        op = ctypes.c_int()
        _check(
            lib().ncclRedOpCreatePreMulSum(ctypes.byref(op), scalar_addr, dtype, 1, self._h()),
            "ncclRedOpCreatePreMulSum",
        )
        return op.value

    def destroy_op(self, op):
        _check(lib().ncclRedOpDestroy(op, self._h()), "ncclRedOpDestroy")

    def finalize(self):
        _check(lib().ncclCommFinalize(self._h()), "ncclCommFinalize")

    def destroy(self):
        if self.handle:
            h, self.handle = self.handle, ctypes.c_void_p()
            _check(lib().ncclCommDestroy(h), "ncclCommDestroy")

    def abort(self):
        if self.handle:
            h, self.handle = self.handle, ctypes.c_void_p()
            _check(lib().ncclCommAbort(h), "ncclCommAbort")
