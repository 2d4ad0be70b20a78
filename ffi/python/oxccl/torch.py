"""The ``"oxccl"`` backend of ``torch.distributed`` (CPU and CUDA tensors), in pure Python.

``import oxccl.torch`` registers it; then ``dist.init_process_group("oxccl", ...)`` (or a
``"cpu:oxccl"`` device map) uses it. Like NCCL's process group, it bootstraps its communicator
through the group's store: rank 0 publishes a unique id there, the others read it.

Every operation runs on the backend's own worker thread, in submission order, and returns at
once with a Work whose ``wait()`` and ``get_future()`` complete when the data has moved; the C
calls release the GIL, so DDP's backward pass overlaps with communication. The group's timeout
bounds every wait (it becomes the communicator's ``OXCCL_TIMEOUT``), and an expired or failed
operation raises from ``wait()`` with oxccl's message naming the rank and the operation.

CUDA tensors go through the same C ABI with the tensor's current stream: the call enqueues and
returns (NCCL's semantics), later work on that stream is ordered after the collective.

No per-version compilation: the backend subclasses torch's Python ``Backend`` trampoline (the
mechanism torch's own pure-Python ``nccl4py`` backend uses).
"""

import ctypes
import os
import queue
import threading
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _C10DBackend, ReduceOp

import oxccl as _ox

__all__ = ["OxcclBackend", "register"]

_DTYPES = {
    torch.int8: 0,
    torch.uint8: 1,
    torch.bool: 1,
    torch.int32: 2,
    torch.int64: 4,
    torch.float16: 6,
    torch.float32: 7,
    torch.float64: 8,
    torch.bfloat16: 9,
}
for _name, _code in (("uint32", 3), ("uint64", 5), ("float8_e4m3fn", 10), ("float8_e5m2", 11)):
    if hasattr(torch, _name):
        _DTYPES[getattr(torch, _name)] = _code

_OPS = {
    ReduceOp.SUM: 0,
    ReduceOp.PRODUCT: 1,
    ReduceOp.MAX: 2,
    ReduceOp.MIN: 3,
    ReduceOp.AVG: 4,
}


class _Work(dist._Work):
    """An operation in flight on the backend's worker thread."""

    def __init__(self, result, timeout):
        super().__init__()
        self._done = threading.Event()
        self._error = None
        self._result = result
        self._timeout = timeout
        self._fut = torch.futures.Future()

    def _finish(self, error):
        self._error = error
        self._done.set()
        if error is None:
            self._fut.set_result(self._result)
        else:
            self._fut.set_exception(error)

    def is_completed(self):
        return self._done.is_set()

    def is_success(self):
        return self._done.is_set() and self._error is None

    def exception(self):
        return self._error

    def wait(self, timeout=None):
        t = timeout if timeout not in (None, timedelta(0)) else self._timeout
        secs = t.total_seconds() if isinstance(t, timedelta) else t
        # the communicator's own deadline (the same timeout) fails the operation with a hang
        # report naming the missing ranks; this bound is the backstop
        if not self._done.wait(secs + 2.0):
            raise RuntimeError(f"oxccl: operation did not complete within {secs:.0f} s (the group's timeout)")
        if self._error is not None:
            raise self._error
        return True

    def get_future(self):
        return self._fut


def _check(t):
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"oxccl backend: expected a CPU or CUDA tensor, got {t.device}")
    if not t.is_contiguous():
        raise ValueError("oxccl backend: expected a contiguous tensor")
    if t.dtype not in _DTYPES:
        raise ValueError(f"oxccl backend: unsupported dtype {t.dtype}")


def _cuda_tensor(result):
    """The first CUDA tensor of a result (a tensor or nested lists of them), or None."""
    if isinstance(result, torch.Tensor):
        return result if result.is_cuda else None
    if isinstance(result, (list, tuple)):
        for r in result:
            t = _cuda_tensor(r)
            if t is not None:
                return t
    return None


def _dt(t):
    return _DTYPES[t.dtype]


class OxcclBackend(_C10DBackend):
    """torch.distributed backend over oxccl's C ABI, for CPU and CUDA tensors."""

    _UID_KEY = "oxccl_uid"

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        self._timeout = timeout if isinstance(timeout, timedelta) else timedelta(seconds=float(timeout))
        # the communicator's bound on every wait is the group's timeout
        os.environ["OXCCL_TIMEOUT"] = str(max(1.0, self._timeout.total_seconds()))
        if rank == 0:
            uid = _ox.get_unique_id()
            store.set(self._UID_KEY, uid)
        else:
            store.wait([self._UID_KEY], self._timeout)
            uid = bytes(store.get(self._UID_KEY))
        self._comm = _ox.Comm.init_rank(size, uid, rank)
        self._coalesced = None  # list of recorded operations while coalescing
        self._queue = queue.Queue()
        self._worker = threading.Thread(target=self._run, name=f"oxccl-rank{rank}", daemon=True)
        self._worker.start()

    # ---- the worker ---------------------------------------------------------------------

    def _run(self):
        while True:
            job = self._queue.get()
            if job is None:
                return
            fn, work = job
            try:
                fn()
                work._finish(None)
            except BaseException as e:  # noqa: BLE001 - handed to the waiter
                work._finish(e if isinstance(e, Exception) else RuntimeError(str(e)))
            finally:
                self._queue.task_done()

    def _submit(self, fn, result):
        if self._comm is None:
            raise RuntimeError("oxccl backend: the process group was shut down")
        work = _Work(result, self._timeout)
        cuda = _cuda_tensor(result)
        if cuda is not None and self._coalesced is None:
            # CUDA tensors: enqueued on the tensor's current stream through the C ABI, in the
            # calling thread, as ProcessGroupNCCL does (the call returns at once; later work on
            # the stream is ordered after the collective). Earlier CPU jobs go first so every
            # rank issues its collectives in one order.
            self._queue.join()
            self._comm.stream = torch.cuda.current_stream(cuda.device).cuda_stream
            try:
                fn()
                work._finish(None)
            except Exception as e:  # noqa: BLE001 - handed to the waiter
                work._finish(e)
            finally:
                self._comm.stream = None
            return work
        if self._coalesced is not None:
            # recorded; runs in one ncclGroupStart/End at end_coalescing
            self._coalesced.append(fn)
            self._coalesced_tensors.append(result)
            work._finish(None)
            return work
        self._queue.put((fn, work))
        return work

    @property
    def supports_coalescing(self):
        return True

    def start_coalescing(self):
        self._coalesced = []
        self._coalesced_tensors = []

    def end_coalescing(self):
        fns, self._coalesced = self._coalesced or [], None
        tensors, self._coalesced_tensors = getattr(self, "_coalesced_tensors", []), []

        def run():
            with _ox.group():
                for fn in fns:
                    fn()

        return self._submit(run, tensors)

    def _op(self, reduce_op, t):
        """(op code, cleanup) for a ReduceOp."""
        if reduce_op.op == ReduceOp.PREMUL_SUM:
            factor = reduce_op.factor
            scalar = factor.to(t.dtype).reshape(1) if isinstance(factor, torch.Tensor) else torch.tensor([factor], dtype=t.dtype)
            op = self._comm.create_pre_mul_sum(scalar.data_ptr(), _dt(t))
            return op, lambda: self._comm.destroy_op(op)
        try:
            return _OPS[reduce_op.op], None
        except KeyError:
            raise ValueError(f"oxccl backend: unsupported reduce op {reduce_op}") from None

    # ---- torch.distributed's Backend API ----------------------------------------------------

    def getBackendName(self):
        return "oxccl"

    @property
    def supports_splitting(self):
        return False

    def allreduce(self, tensors, opts):
        for t in tensors:
            _check(t)
        op, cleanup = self._op(opts.reduceOp, tensors[0])

        def run():
            try:
                for t in tensors:
                    self._comm.all_reduce(t.data_ptr(), t.data_ptr(), t.numel(), _dt(t), op)
            finally:
                if cleanup:
                    cleanup()

        return self._submit(run, tensors)

    def broadcast(self, tensors, opts):
        for t in tensors:
            _check(t)

        def run():
            for t in tensors:
                self._comm.broadcast(t.data_ptr(), t.data_ptr(), t.numel(), _dt(t), opts.rootRank)

        return self._submit(run, tensors)

    def reduce(self, tensors, opts):
        for t in tensors:
            _check(t)
        op, cleanup = self._op(opts.reduceOp, tensors[0])

        def run():
            try:
                for t in tensors:
                    self._comm.reduce(t.data_ptr(), t.data_ptr(), t.numel(), _dt(t), op, opts.rootRank)
            finally:
                if cleanup:
                    cleanup()

        return self._submit(run, tensors)

    def allgather(self, output_tensors, input_tensors, opts):
        for t in input_tensors:
            _check(t)

        def run():
            for outs, inp in zip(output_tensors, input_tensors):
                flat = torch.empty(inp.numel() * self.size(), dtype=inp.dtype)
                self._comm.all_gather(inp.data_ptr(), flat.data_ptr(), inp.numel(), _dt(inp))
                for i, out in enumerate(outs):
                    out.copy_(flat.narrow(0, i * inp.numel(), inp.numel()).view_as(out))

        return self._submit(run, output_tensors)

    def _allgather_base(self, output, input, opts):
        return self.all_gather_single(output, input, opts)

    def all_gather_single(self, output, input, opts):
        _check(output)
        _check(input)
        if output.numel() != input.numel() * self.size():
            raise ValueError("oxccl backend: all_gather_into_tensor needs output.numel() == input.numel() * world_size")

        def run():
            self._comm.all_gather(input.data_ptr(), output.data_ptr(), input.numel(), _dt(input))

        return self._submit(run, [output])

    def reduce_scatter(self, output_tensors, input_tensors, opts):
        for t in output_tensors:
            _check(t)
        op, cleanup = self._op(opts.reduceOp, output_tensors[0])

        def run():
            try:
                for out, ins in zip(output_tensors, input_tensors):
                    flat = torch.cat([t.contiguous().view(-1) for t in ins])
                    self._comm.reduce_scatter(flat.data_ptr(), out.data_ptr(), out.numel(), _dt(out), op)
            finally:
                if cleanup:
                    cleanup()

        return self._submit(run, output_tensors)

    def _reduce_scatter_base(self, output, input, opts):
        return self.reduce_scatter_single(output, input, opts)

    def reduce_scatter_single(self, output, input, opts):
        _check(output)
        _check(input)
        if input.numel() != output.numel() * self.size():
            raise ValueError("oxccl backend: reduce_scatter_tensor needs input.numel() == output.numel() * world_size")
        op, cleanup = self._op(opts.reduceOp, output)

        def run():
            try:
                self._comm.reduce_scatter(input.data_ptr(), output.data_ptr(), output.numel(), _dt(output), op)
            finally:
                if cleanup:
                    cleanup()

        return self._submit(run, [output])

    def gather(self, output_tensors, input_tensors, opts):
        for t in input_tensors:
            _check(t)
        root = opts.rootRank

        def run():
            for idx, inp in enumerate(input_tensors):
                if self.rank() == root:
                    flat = torch.empty(inp.numel() * self.size(), dtype=inp.dtype)
                    self._comm.gather(inp.data_ptr(), flat.data_ptr(), inp.numel(), _dt(inp), root)
                    for i, out in enumerate(output_tensors[idx]):
                        out.copy_(flat.narrow(0, i * inp.numel(), inp.numel()).view_as(out))
                else:
                    self._comm.gather(inp.data_ptr(), None, inp.numel(), _dt(inp), root)

        return self._submit(run, output_tensors)

    def scatter(self, output_tensors, input_tensors, opts):
        for t in output_tensors:
            _check(t)
        root = opts.rootRank

        def run():
            for idx, out in enumerate(output_tensors):
                if self.rank() == root:
                    flat = torch.cat([t.contiguous().view(-1) for t in input_tensors[idx]])
                    self._comm.scatter(flat.data_ptr(), out.data_ptr(), out.numel(), _dt(out), root)
                else:
                    self._comm.scatter(None, out.data_ptr(), out.numel(), _dt(out), root)

        return self._submit(run, output_tensors)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts):
        return self.all_to_all_single(output, input, output_split_sizes, input_split_sizes, opts)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts):
        _check(output)
        _check(input)
        size = self.size()

        def run():
            if not output_split_sizes and not input_split_sizes:
                self._comm.all_to_all(input.data_ptr(), output.data_ptr(), input.numel() // size, _dt(input))
                return
            in_row = input.numel() // input.size(0) if input.numel() else 1
            out_row = output.numel() // output.size(0) if output.numel() else 1
            ins = input_split_sizes or [input.size(0) // size] * size
            outs = output_split_sizes or [output.size(0) // size] * size
            es = input.element_size()
            in_off = out_off = 0
            with _ox.group():
                for peer in range(size):
                    sc, rc = ins[peer] * in_row, outs[peer] * out_row
                    if sc:
                        self._comm.send(input.data_ptr() + in_off * es, sc, _dt(input), peer)
                    if rc:
                        self._comm.recv(output.data_ptr() + out_off * es, rc, _dt(output), peer)
                    in_off += sc
                    out_off += rc

        return self._submit(run, [output])

    def alltoall(self, output_tensors, input_tensors, opts):
        for t in list(output_tensors) + list(input_tensors):
            _check(t)

        def run():
            with _ox.group():
                for peer in range(self.size()):
                    i, o = input_tensors[peer], output_tensors[peer]
                    self._comm.send(i.data_ptr(), i.numel(), _dt(i), peer)
                    self._comm.recv(o.data_ptr(), o.numel(), _dt(o), peer)

        return self._submit(run, output_tensors)

    def send(self, tensors, dst, tag=0):
        for t in tensors:
            _check(t)

        def run():
            for t in tensors:
                self._comm.send(t.data_ptr(), t.numel(), _dt(t), dst)

        return self._submit(run, tensors)

    def recv(self, tensors, src, tag=0):
        for t in tensors:
            _check(t)

        def run():
            for t in tensors:
                self._comm.recv(t.data_ptr(), t.numel(), _dt(t), src)

        return self._submit(run, tensors)

    def barrier(self, opts):
        t = torch.zeros(1)

        def run():
            self._comm.all_reduce(t.data_ptr(), t.data_ptr(), 1, 7, 0)

        return self._submit(run, [t])

    def shutdown(self):
        if self._comm is not None:
            self._queue.put(None)
            self._worker.join(timeout=self._timeout.total_seconds())
            try:
                self._comm.destroy()
            finally:
                self._comm = None

    def abort(self):
        if self._comm is not None:
            comm, self._comm = self._comm, None
            comm.abort()
            self._queue.put(None)


def _create(store, rank, size, timeout):
    return OxcclBackend(store, rank, size, timeout)


def register():
    """Register the ``"oxccl"`` backend for CPU tensors (done on import)."""
    if "oxccl" not in dist.Backend.backend_list:
        dist.Backend.register_backend("oxccl", _create, devices=["cpu", "cuda"])


register()
