"""The torch backend's data movement (mixed into ``oxccl.torch.Impl``): broadcast, gathers,
scatter, all-to-all, point-to-point and barrier. Same rules as ``_torch_ops``: arguments are
checked in the calling thread, non-contiguous tensors are staged."""

import torch

import oxccl as _ox
from oxccl._torch_ops import Staged, bad, check, check_root, dt, same_shape


class Moves:
    """Data movement; `self._comm`, `self._submit`, `self.rank()`, `self.size()` come from Impl."""

    def broadcast(self, tensors, root, root_tensor=0, timeout_ms=-1):
        check_root(root, self.size())
        for t in tensors:
            check(t)

        def run():
            for t in tensors:
                s = Staged(t)
                self._comm.broadcast(s.ptr, s.ptr, s.c.numel(), dt(s.c), root)
                s.done()

        return self._submit("broadcast", run, tensors, timeout_ms)

    def _check_lists(self, lists, singles, what):
        if len(lists) != len(singles):
            raise bad(f"{what} needs one tensor list per tensor ({len(lists)} lists, {len(singles)} tensors)")
        for i, (ts, one) in enumerate(zip(lists, singles)):
            check(one)
            if len(ts) != self.size():
                raise bad(f"{what}: tensor list {i} has {len(ts)} tensors, expected {self.size()} (the group size)")
            for j, t in enumerate(ts):
                check(t)
                same_shape(t, one, f"{what}: tensor {j} of list {i}")

    def _gather_into(self, inp, outs):
        """all_gather `inp` and copy the pieces into `outs`."""
        flat = torch.empty(inp.numel() * self.size(), dtype=inp.dtype, device=inp.device)
        c = inp.contiguous()
        self._comm.all_gather(c.data_ptr(), flat.data_ptr(), c.numel(), dt(c))
        for i, out in enumerate(outs):
            out.copy_(flat[i * c.numel() : (i + 1) * c.numel()].view(out.shape))

    def allgather(self, output_lists, inputs, timeout_ms=-1):
        self._check_lists(output_lists, inputs, "all_gather")

        def run():
            for outs, inp in zip(output_lists, inputs):
                self._gather_into(inp, outs)

        return self._submit("allgather", run, output_lists, timeout_ms)

    def allgather_coalesced(self, output_lists, inputs, timeout_ms=-1):
        """One all-gather of all inputs flattened together (gloo's algorithm), for one dtype."""
        if len(output_lists) != self.size():
            raise bad(f"all_gather_coalesced needs {self.size()} output lists (one per rank), got {len(output_lists)}")
        for r, outs in enumerate(output_lists):
            if len(outs) != len(inputs):
                raise bad(f"all_gather_coalesced: output list {r} has {len(outs)} tensors, expected {len(inputs)}")
            for t, inp in zip(outs, inputs):
                check(inp)
                check(t)
                same_shape(t, inp, f"all_gather_coalesced: a tensor of output list {r}")
        if len({t.dtype for t in inputs}) > 1:
            raise bad("all_gather_coalesced needs input tensors of one dtype")

        def run():
            flat = torch.cat([t.reshape(-1) for t in inputs])
            gathered = torch.empty(flat.numel() * self.size(), dtype=flat.dtype)
            self._comm.all_gather(flat.data_ptr(), gathered.data_ptr(), flat.numel(), dt(flat))
            for r, outs in enumerate(output_lists):
                off = r * flat.numel()
                for t in outs:
                    t.copy_(gathered[off : off + t.numel()].view(t.shape))
                    off += t.numel()

        return self._submit("allgather_coalesced", run, output_lists, timeout_ms)

    def allgather_base(self, output, input, timeout_ms=-1):
        check(output, "the output")
        check(input, "the input")
        if output.numel() != input.numel() * self.size() or output.dtype != input.dtype:
            raise bad(
                "all_gather_into_tensor needs output.numel() == input.numel() * world_size and one dtype "
                f"(output {output.dtype}[{output.numel()}], input {input.dtype}[{input.numel()}], world size {self.size()})"
            )

        def run():
            s = Staged(output, load=False)
            c = input.contiguous()
            self._comm.all_gather(c.data_ptr(), s.ptr, c.numel(), dt(c))
            s.done()

        return self._submit("allgather_into_tensor", run, [output], timeout_ms)

    def allgather_into_tensor_coalesced(self, outputs, inputs, timeout_ms=-1):
        for out, inp in zip(outputs, inputs):
            check(out, "an output")
            check(inp, "an input")
            if out.numel() != inp.numel() * self.size() or out.dtype != inp.dtype:
                raise bad("all_gather_into_tensor_coalesced: each output needs input.numel() * world_size elements of its dtype")

        def run():
            staged = [(inp.contiguous(), Staged(out, load=False)) for out, inp in zip(outputs, inputs)]
            with _ox.group():
                for inp, s in staged:
                    self._comm.all_gather(inp.data_ptr(), s.ptr, inp.numel(), dt(inp))
            for _, s in staged:
                s.done()

        return self._submit("allgather_into_tensor_coalesced", run, outputs, timeout_ms)

    def gather(self, output_lists, inputs, root, timeout_ms=-1):
        check_root(root, self.size())
        if self.rank() == root:
            self._check_lists(output_lists, inputs, "gather")
        else:
            if output_lists and any(len(x) for x in output_lists):
                raise bad(f"gather: only the root (rank {root}) passes output tensors")
            for t in inputs:
                check(t)

        def run():
            for idx, inp in enumerate(inputs):
                c = inp.contiguous()
                if self.rank() == root:
                    flat = torch.empty(c.numel() * self.size(), dtype=c.dtype)
                    self._comm.gather(c.data_ptr(), flat.data_ptr(), c.numel(), dt(c), root)
                    for i, out in enumerate(output_lists[idx]):
                        out.copy_(flat[i * c.numel() : (i + 1) * c.numel()].view(out.shape))
                else:
                    self._comm.gather(c.data_ptr(), None, c.numel(), dt(c), root)

        return self._submit("gather", run, output_lists if self.rank() == root else inputs, timeout_ms)

    def scatter(self, outputs, input_lists, root, timeout_ms=-1):
        check_root(root, self.size())
        if self.rank() == root:
            self._check_lists(input_lists, outputs, "scatter")
        else:
            if input_lists and any(len(x) for x in input_lists):
                raise bad(f"scatter: only the root (rank {root}) passes input tensors")
            for t in outputs:
                check(t)

        def run():
            for idx, out in enumerate(outputs):
                s = Staged(out, load=False)
                if self.rank() == root:
                    flat = torch.cat([t.reshape(-1) for t in input_lists[idx]])
                    self._comm.scatter(flat.data_ptr(), s.ptr, s.c.numel(), dt(s.c), root)
                else:
                    self._comm.scatter(None, s.ptr, s.c.numel(), dt(s.c), root)
                s.done()

        return self._submit("scatter", run, outputs, timeout_ms)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, timeout_ms=-1):
        check(output, "the output")
        check(input, "the input")
        size = self.size()
        if output.dtype != input.dtype:
            raise bad(f"all_to_all_single: output {output.dtype} and input {input.dtype} differ")
        ins = list(input_split_sizes) or None
        outs = list(output_split_sizes) or None
        for name, t, splits in (("input", input, ins), ("output", output, outs)):
            if splits is None:
                if t.dim() == 0 or t.size(0) % size:
                    raise bad(f"all_to_all_single: the {name}'s first dimension must divide by the group size {size}")
            elif len(splits) != size or sum(splits) != (t.size(0) if t.dim() else 0) or min(splits) < 0:
                raise bad(f"all_to_all_single: {name} split sizes {splits} must be {size} counts summing to {name}.size(0)")

        def run():
            c, s = input.contiguous(), Staged(output, load=False)
            in_row = c[0].numel() if c.dim() and c.size(0) else 1
            out_row = s.c[0].numel() if s.c.dim() and s.c.size(0) else 1
            i_sp = ins or [c.size(0) // size] * size
            o_sp = outs or [s.c.size(0) // size] * size
            es = c.element_size()
            i_off = o_off = 0
            with _ox.group():
                for peer in range(size):
                    sc, rc = i_sp[peer] * in_row, o_sp[peer] * out_row
                    if sc:
                        self._comm.send(c.data_ptr() + i_off * es, sc, dt(c), peer)
                    if rc:
                        self._comm.recv(s.ptr + o_off * es, rc, dt(s.c), peer)
                    i_off += sc
                    o_off += rc
            s.done()

        return self._submit("all_to_all_single", run, [output], timeout_ms)

    def alltoall(self, outputs, inputs, timeout_ms=-1):
        if len(outputs) != self.size() or len(inputs) != self.size():
            raise bad(f"all_to_all needs {self.size()} input and output tensors (the group size)")
        for t in list(outputs) + list(inputs):
            check(t)

        def run():
            ins = [t.contiguous() for t in inputs]
            outs = [Staged(t, load=False) for t in outputs]
            with _ox.group():
                for peer in range(self.size()):
                    self._comm.send(ins[peer].data_ptr(), ins[peer].numel(), dt(ins[peer]), peer)
                    self._comm.recv(outs[peer].ptr, outs[peer].c.numel(), dt(outs[peer].c), peer)
            for s in outs:
                s.done()

        return self._submit("all_to_all", run, outputs, timeout_ms)

    def _check_peer(self, peer, what):
        if not 0 <= peer < self.size():
            raise bad(f"{what} rank {peer} is out of range for a group of {self.size()}")

    def send(self, tensors, dst, tag=0):
        self._check_peer(dst, "send: destination")
        for t in tensors:
            check(t)

        def run():
            for t in tensors:
                c = t.contiguous()
                self._comm.send(c.data_ptr(), c.numel(), dt(c), dst)

        return self._submit(f"send to rank {dst}", run, tensors)

    def recv(self, tensors, src, tag=0):
        self._check_peer(src, "recv: source")
        for t in tensors:
            check(t)

        def run():
            for t in tensors:
                s = Staged(t, load=False)
                self._comm.recv(s.ptr, s.c.numel(), dt(s.c), src)
                s.done()

        return self._submit(f"recv from rank {src}", run, tensors)

    def recv_anysource(self, tensors, tag=0):
        for t in tensors:
            check(t)
            if t.numel() == 0:
                raise bad("recv without a source needs a tensor of at least one element")

        def run():
            # the first tensor matches a sender; the rest come from the same one, in order
            src = None
            for t in tensors:
                s = Staged(t, load=False)
                if src is None:
                    src = self._comm.recv_any(s.ptr, s.c.numel(), dt(s.c))
                else:
                    self._comm.recv(s.ptr, s.c.numel(), dt(s.c), src)
                s.done()
            return src

        return self._submit("recv from any source", run, tensors, any_source=True)

    def barrier(self, timeout_ms=-1):
        t = torch.zeros(1)

        def run():
            self._comm.all_reduce(t.data_ptr(), t.data_ptr(), 1, 7, 0)

        return self._submit("barrier", run, [t], timeout_ms)
