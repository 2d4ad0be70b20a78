"""The torch backend's operations (mixed into ``oxccl.torch.Impl``), over oxccl's C ABI.

Each method checks its arguments in the calling thread (an error there is raised at once, as
gloo does, and nothing is sent), then hands a closure to ``Impl._submit``. Non-contiguous
tensors are copied in and out around the call. Bitwise reductions, which NCCL's op set lacks,
all-gather the inputs and reduce them locally; sparse all-reduce gathers indices and values and
sums duplicates, as gloo does.
"""

import torch
from torch._C._distributed_c10d import ReduceOp

import oxccl as _ox

DTYPES = {
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
        DTYPES[getattr(torch, _name)] = _code

_OPS = {ReduceOp.SUM: 0, ReduceOp.PRODUCT: 1, ReduceOp.MAX: 2, ReduceOp.MIN: 3, ReduceOp.AVG: 4}
# on bool tensors: sum is "any", product is "all" (the uint8 sum of two trues would read 2)
_BOOL_OPS = {ReduceOp.SUM: 2, ReduceOp.PRODUCT: 3, ReduceOp.MAX: 2, ReduceOp.MIN: 3}
_BITWISE = {ReduceOp.BAND: torch.bitwise_and, ReduceOp.BOR: torch.bitwise_or, ReduceOp.BXOR: torch.bitwise_xor}
_INTEGER = {torch.bool, torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64}


def bad(msg):
    """An error in one call's own arguments: raised before anything is sent (RuntimeError, as
    gloo's TORCH_CHECKs are)."""
    return RuntimeError(f"oxccl backend: {msg}")


def flat_tensors(result):
    """The tensors of a result (a tensor, or nested lists of them), in order."""
    if isinstance(result, torch.Tensor):
        return [result]
    out = []
    for r in result or []:
        out.extend(flat_tensors(r))
    return out


def cuda_tensor(result):
    """The first CUDA tensor of a result, or None."""
    for t in flat_tensors(result):
        if t.is_cuda:
            return t
    return None


def check(t, what="tensor"):
    if not isinstance(t, torch.Tensor):
        raise bad(f"expected a tensor for {what}, got {type(t).__name__}")
    if t.device.type not in ("cpu", "cuda"):
        raise bad(f"expected a CPU or CUDA tensor for {what}, got one on {t.device}")
    if t.layout != torch.strided:
        raise bad(f"{what} is a {t.layout} tensor: only all_reduce takes sparse (COO) tensors")
    if t.dtype not in DTYPES:
        raise bad(f"data type {t.dtype} of {what} is not supported (supported: {sorted(str(d) for d in DTYPES)})")


def same_shape(t, ref, what):
    if t.dtype != ref.dtype or t.shape != ref.shape:
        raise bad(
            f"{what} is {t.dtype}{list(t.shape)}, expected {ref.dtype}{list(ref.shape)} (the input's); "
            "nothing was sent, the group stays usable"
        )


def check_root(root, size):
    if not 0 <= root < size:
        raise bad(f"root rank {root} is out of range for a group of {size}")


class Staged:
    """A tensor as a contiguous buffer: the tensor itself, or a copy written back by `done()`."""

    def __init__(self, t, load=True):
        self.t = t
        self.c = t if t.is_contiguous() else (t.contiguous() if load else torch.empty(t.shape, dtype=t.dtype, device=t.device))

    @property
    def ptr(self):
        return self.c.data_ptr()

    def done(self):
        if self.c is not self.t:
            self.t.copy_(self.c)


def dt(t):
    return DTYPES[t.dtype]


class Op:
    """A ReduceOp resolved for a dtype: an NCCL op code (`code`, with `cleanup`), or a local
    bitwise function (`bitwise`)."""

    def __init__(self, comm, reduce_op, t):
        self.code, self.cleanup, self.bitwise = None, None, None
        kind = reduce_op.op if hasattr(reduce_op, "op") else reduce_op
        if kind in _BITWISE:
            if t.dtype not in _INTEGER:
                raise bad(f"{kind} is defined on integer and bool tensors, not {t.dtype}")
            self.bitwise = _BITWISE[kind]
        elif kind == ReduceOp.PREMUL_SUM:
            factor = reduce_op.factor
            scalar = (
                factor.to(t.dtype).reshape(1)
                if isinstance(factor, torch.Tensor)
                else torch.tensor([factor], dtype=t.dtype)
            )
            self.code = comm.create_pre_mul_sum(scalar.data_ptr(), dt(t))
            self.cleanup = lambda: comm.destroy_op(self.code)
        elif t.dtype == torch.bool and kind in _BOOL_OPS:
            self.code = _BOOL_OPS[kind]
        elif kind in _OPS:
            self.code = _OPS[kind]
        else:
            raise bad(f"reduce op {kind} is not supported (SUM, PRODUCT, MAX, MIN, AVG, PREMUL_SUM, BAND, BOR, BXOR are)")

    def close(self):
        if self.cleanup:
            self.cleanup()


class Ops:
    """The operations; `self._comm`, `self._submit`, `self.rank()`, `self.size()` come from Impl."""

    # ---- reductions ---------------------------------------------------------------------

    def _all_reduce(self, s, op):
        """In place on a Staged buffer."""
        if op.bitwise is None:
            self._comm.all_reduce(s.ptr, s.ptr, s.c.numel(), dt(s.c), op.code)
            return
        parts = torch.empty((self.size(),) + tuple(s.c.shape), dtype=s.c.dtype, device=s.c.device)
        self._comm.all_gather(s.ptr, parts.data_ptr(), s.c.numel(), dt(s.c))
        acc = parts[0].clone()
        for p in parts[1:]:
            acc = op.bitwise(acc, p)
        s.c.copy_(acc)

    def allreduce(self, tensors, reduce_op, timeout_ms=-1):
        if any(t.layout == torch.sparse_coo for t in tensors):
            return self.allreduce_sparse(tensors, reduce_op, timeout_ms)
        for t in tensors:
            check(t)
        op = Op(self._comm, reduce_op, tensors[0])

        def run():
            try:
                for t in tensors:
                    s = Staged(t)
                    self._all_reduce(s, op)
                    s.done()
            finally:
                op.close()

        return self._submit("allreduce", run, tensors, timeout_ms)

    def allreduce_coalesced(self, tensors, reduce_op, timeout_ms=-1):
        """One all-reduce of all the tensors flattened together (one dtype), else one group."""
        for t in tensors:
            check(t)
        if not tensors:
            raise bad("allreduce_coalesced needs at least one tensor")
        op = Op(self._comm, reduce_op, tensors[0])
        one_dtype = all(t.dtype == tensors[0].dtype and t.device == tensors[0].device for t in tensors)

        def run():
            try:
                if one_dtype:
                    flat = torch.cat([t.reshape(-1) for t in tensors])
                    s = Staged(flat)
                    self._all_reduce(s, op)
                    off = 0
                    for t in tensors:
                        t.copy_(flat[off : off + t.numel()].view(t.shape))
                        off += t.numel()
                    return
                staged = [Staged(t) for t in tensors]
                # one op per dtype, made before the group and closed after it (PREMUL_SUM ops
                # are communicator resources)
                ops = {}
                try:
                    for s in staged:
                        if s.c.dtype not in ops:
                            ops[s.c.dtype] = Op(self._comm, reduce_op, s.c)
                    with _ox.group():
                        for s in staged:
                            self._comm.all_reduce(s.ptr, s.ptr, s.c.numel(), dt(s.c), ops[s.c.dtype].code)
                finally:
                    for o in ops.values():
                        o.close()
                for s in staged:
                    s.done()
            finally:
                op.close()

        if not one_dtype and op.bitwise is not None:
            raise bad("bitwise allreduce_coalesced needs tensors of one dtype")
        return self._submit("allreduce_coalesced", run, tensors, timeout_ms)

    def allreduce_sparse(self, tensors, reduce_op, timeout_ms=-1):
        """gloo's algorithm: gather every rank's indices and values, then sum duplicates."""
        kind = reduce_op.op if hasattr(reduce_op, "op") else reduce_op
        if kind != ReduceOp.SUM:
            raise bad(f"sparse all_reduce supports SUM only, not {kind}")
        for t in tensors:
            if t.layout != torch.sparse_coo or t.device.type != "cpu":
                raise bad("allreduce_sparse takes sparse COO CPU tensors")

        def run():
            for t in tensors:
                t.copy_(self._sparse_sum(t))

        return self._submit("allreduce_sparse", run, tensors, timeout_ms)

    def _gather_rows(self, x, counts, m):
        """All ranks' `x` (first dimension counts[r] <= m), concatenated in rank order."""
        pad = torch.zeros((m,) + tuple(x.shape[1:]), dtype=x.dtype)
        pad[: x.shape[0]] = x
        out = torch.empty((self.size(),) + tuple(pad.shape), dtype=x.dtype)
        if pad.numel():
            self._comm.all_gather(pad.data_ptr(), out.data_ptr(), pad.numel(), dt(pad))
        return torch.cat([out[r, : counts[r]] for r in range(self.size())])

    def _sparse_sum(self, t):
        t = t.coalesce()
        idx, vals = t._indices().t().contiguous(), t._values().contiguous()
        if vals.dtype not in DTYPES:
            raise bad(f"sparse values of type {vals.dtype} are not supported")
        nnz = torch.tensor([idx.shape[0]], dtype=torch.int64)
        counts = torch.empty(self.size(), dtype=torch.int64)
        self._comm.all_gather(nnz.data_ptr(), counts.data_ptr(), 1, dt(nnz))
        counts = counts.tolist()
        m = max(counts)
        all_idx = self._gather_rows(idx, counts, m)
        all_vals = self._gather_rows(vals, counts, m)
        return torch.sparse_coo_tensor(all_idx.t(), all_vals, t.shape).coalesce()

    def reduce(self, tensors, reduce_op, root, root_tensor=0, timeout_ms=-1):
        check_root(root, self.size())
        for t in tensors:
            check(t)
        op = Op(self._comm, reduce_op, tensors[0])

        def run():
            try:
                for t in tensors:
                    s = Staged(t)
                    if op.bitwise is not None:
                        self._all_reduce(s, op)
                    else:
                        self._comm.reduce(s.ptr, s.ptr, s.c.numel(), dt(s.c), op.code, root)
                    s.done()
            finally:
                op.close()

        return self._submit("reduce", run, tensors, timeout_ms)

    def reduce_scatter(self, outputs, input_lists, reduce_op, timeout_ms=-1):
        if len(outputs) != len(input_lists):
            raise bad("reduce_scatter needs one input list per output tensor")
        for out, ins in zip(outputs, input_lists):
            check(out, "the output")
            if len(ins) != self.size():
                raise bad(f"reduce_scatter's input list has {len(ins)} tensors, expected {self.size()} (the group size)")
            for i, t in enumerate(ins):
                same_shape(t, out, f"input tensor {i}")
        op = Op(self._comm, reduce_op, outputs[0])

        def run():
            try:
                for out, ins in zip(outputs, input_lists):
                    flat = torch.cat([t.reshape(-1) for t in ins])
                    self._reduce_scatter_flat(flat, Staged(out, load=False), op)
            finally:
                op.close()

        return self._submit("reduce_scatter", run, outputs, timeout_ms)

    def _reduce_scatter_flat(self, flat, s, op):
        n = s.c.numel()
        if op.bitwise is not None:
            whole = Staged(flat)
            self._all_reduce(whole, op)
            s.c.copy_(flat[self.rank() * n : (self.rank() + 1) * n].view(s.c.shape))
        else:
            self._comm.reduce_scatter(flat.data_ptr(), s.ptr, n, dt(s.c), op.code)
        s.done()

    def reduce_scatter_base(self, output, input, reduce_op, timeout_ms=-1):
        check(output, "the output")
        check(input, "the input")
        if input.numel() != output.numel() * self.size() or input.dtype != output.dtype:
            raise bad(
                f"reduce_scatter_tensor needs input.numel() == output.numel() * world_size and one dtype "
                f"(input {input.dtype}[{input.numel()}], output {output.dtype}[{output.numel()}], world size {self.size()})"
            )
        op = Op(self._comm, reduce_op, output)

        def run():
            try:
                self._reduce_scatter_flat(input.contiguous().view(-1), Staged(output, load=False), op)
            finally:
                op.close()

        return self._submit("reduce_scatter_tensor", run, [output], timeout_ms)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, reduce_op, timeout_ms=-1):
        for out, inp in zip(outputs, inputs):
            check(out, "an output")
            check(inp, "an input")
            if inp.numel() != out.numel() * self.size() or inp.dtype != out.dtype:
                raise bad("reduce_scatter_tensor_coalesced: each input needs output.numel() * world_size elements of its dtype")
        ops = [Op(self._comm, reduce_op, o) for o in outputs]
        if any(op.bitwise is not None for op in ops):
            raise bad("bitwise reductions are not supported in reduce_scatter_tensor_coalesced")

        def run():
            staged = [(inp.contiguous(), Staged(out, load=False)) for out, inp in zip(outputs, inputs)]
            try:
                with _ox.group():
                    for (inp, s), op in zip(staged, ops):
                        self._comm.reduce_scatter(inp.data_ptr(), s.ptr, s.c.numel(), dt(s.c), op.code)
                for _, s in staged:
                    s.done()
            finally:
                for op in ops:
                    op.close()

        return self._submit("reduce_scatter_tensor_coalesced", run, outputs, timeout_ms)
