"""The ``"oxccl"`` backend of ``torch.distributed`` (CPU and CUDA tensors).

``import oxccl.torch`` registers it; then ``dist.init_process_group("oxccl", ...)`` (or a
``"cpu:oxccl"`` device map) uses it. Like NCCL's process group, it bootstraps its communicator
through the group's store: rank 0 publishes a unique id there, the others read it.

Two parts:

- a small C++ ``c10d::Backend`` and ``c10d::Work`` (``_torch_ext.cpp``, built against the
  installed torch by ``pip install`` or at first import: see ``oxccl._ext``). torch calls their
  virtual methods directly, so ``work.is_completed()``, ``is_success()``, ``exception()``,
  ``wait(timeout)``, ``get_future()``, ``result()`` and ``_source_rank()`` are right, and so are
  sequence numbers (``TORCH_DISTRIBUTED_DEBUG=DETAIL``);
- the operations, here and in ``_torch_ops.py``, over oxccl's C ABI.

Every operation on CPU tensors runs on the backend's own worker thread, in submission order, and
returns at once; the C calls release the GIL, so DDP's backward pass overlaps with
communication. CUDA tensors are enqueued on the tensor's current stream in the calling thread
(NCCL's semantics).

The group's timeout is this communicator's own bound on every wait (no process-wide setting):
an operation that cannot finish fails within it with oxccl's report naming the rank, the peer
and the operation, after torch's usual wording ("Timed out ..."). This is the watchdog that
torch does not give Python backends: no wait is unbounded.

Errors in one call's own arguments (shapes, dtypes, ops) are raised in the calling thread
before anything is sent, and leave the group usable, as gloo does.
"""

import queue
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import oxccl as _ox
from oxccl import _ext
from oxccl._torch_elastic import Elastic
from oxccl._torch_moves import Moves
from oxccl._torch_ops import Ops, cuda_tensor, flat_tensors

__all__ = ["register", "backend_impl", "shrink_group", "grow_id", "grow_group", "join_grown_group"]

_EXT = _ext.load()

# ncclResult_t codes that get torch's wording first
_TIMEOUT, _REMOTE = 8, 6


# the names ProcessGroupNCCL gives its profiler ranges ("nccl:" + this), where ours differ
_PROFILE_NAMES = {
    "allreduce": "all_reduce",
    "allreduce_coalesced": "all_reduce_coalesced",
    "allreduce_sparse": "all_reduce_sparse",
    "allgather": "all_gather",
    "allgather_coalesced": "all_gather_coalesced",
    "allgather_into_tensor": "_allgather_base",
    "allgather_into_tensor_coalesced": "all_gather_into_tensor_coalesced",
    "reduce_scatter_tensor": "_reduce_scatter_base",
    "all_to_all_single": "all_to_all",
}


def _message(e, rank, what, ms):
    """torch's words for an operation's failure (gloo's, which users and torch's tests look
    for), then oxccl's detail."""
    code = getattr(e, "code", None)
    if code == _TIMEOUT:
        return f"[rank {rank}] Timed out waiting {ms}ms for {what} to complete: {e}"
    if code == _REMOTE:
        return f"[rank {rank}] Connection closed by peer during {what}: {e}"
    return str(e)


class Impl(Ops, Moves, Elastic):
    """What the C++ Backend calls: one communicator, one worker thread."""

    _ext = _EXT

    _UID_KEY = "oxccl_uid"

    def __init__(self, store, rank, size, timeout, comm=None, reconfigure=False):
        """``reconfigure``: torch's ``enable_reconfigure``: no communicator until ``reconfigure``."""
        self._rank, self._size = rank, size
        self._timeout = timeout if isinstance(timeout, timedelta) else timedelta(seconds=float(timeout))
        self._base_store, self._handle, self._reconfigured = store, None, reconfigure
        if comm is None and not reconfigure:
            if rank == 0:
                store.set(self._UID_KEY, _ox.get_unique_id())
            else:
                store.wait([self._UID_KEY], self._timeout)
            uid = bytes(store.get(self._UID_KEY))
            # the group's timeout bounds every wait of this communicator (not the process's)
            comm = _ox.Comm.init_rank(size, uid, rank, timeout=max(1.0, self._timeout.total_seconds()))
        self._store = store  # monitored_barrier's channel
        self._monitored = 0
        self._comm = comm
        self._error = 0  # c10d's ErrorType of the first failure: torchft's errored()
        self._changes = 0  # shrinks and grows made from this group (their store prefixes)
        self._blocking = False  # set by the C++ Backend around a call whose caller waits at once
        self._coalesced = None  # (fn, work) recorded between start_ and end_coalescing
        self._running = threading.Lock()  # held while an operation runs, in whichever thread
        self._start_worker()

    def _start_worker(self):
        self._queue = queue.Queue()
        self._worker = threading.Thread(target=self._run, name=f"oxccl-rank{self._rank}", daemon=True)
        self._worker.start()

    def rank(self):
        return self._rank

    def size(self):
        return self._size

    # ---- the worker ---------------------------------------------------------------------

    def _run(self):
        while True:
            job = self._queue.get()
            if job is None:
                return
            with self._running:
                self._execute(*job)
            self._queue.task_done()

    def _execute(self, fn, works, what, ms):
        try:
            source = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the waiters
            if not self._error:
                code = getattr(e, "code", None)
                self._error = {_TIMEOUT: 1, _REMOTE: 3}.get(code, 2)
            msg = _message(e, self._rank, what, ms)
            for w in works:
                _EXT.complete(w, msg)
            return
        for w in works:
            _EXT.complete(w, None, -1 if source is None else source)

    def _ms(self, timeout_ms=-1):
        return timeout_ms if timeout_ms and timeout_ms > 0 else int(self._timeout.total_seconds() * 1000)

    def _submit(self, what, fn, result, timeout_ms=-1, any_source=False):
        """Run `fn` (which returns the matched source of an any-source receive, or None) in order
        on the worker; returns its Work. Under torch.profiler the call is a `nccl:<op>` range, as
        ProcessGroupNCCL names its own (checking the profiler first costs nothing when it is off)."""
        if torch.autograd._profiler_enabled():
            with torch.profiler.record_function("nccl:" + _PROFILE_NAMES.get(what, what)):
                return self._submit_now(what, fn, result, timeout_ms, any_source)
        return self._submit_now(what, fn, result, timeout_ms, any_source)

    def _submit_now(self, what, fn, result, timeout_ms, any_source):
        if self._comm is None:
            if self._reconfigured:
                raise RuntimeError("oxccl backend: created with enable_reconfigure: call reconfigure first")
            raise RuntimeError("oxccl backend: the process group was shut down or aborted")
        ms = self._ms(timeout_ms)
        work = _EXT.new_work(self._rank, flat_tensors(result), ms, any_source, what)
        if self._coalesced is not None:
            # recorded; runs in one ncclGroupStart/End at end_coalescing, which completes it
            self._coalesced.append((fn, work))
            return work
        cuda = cuda_tensor(result)
        if cuda is not None:
            # enqueued on the tensor's current stream in this thread, as ProcessGroupNCCL does;
            # earlier CPU jobs go first so that every rank issues its operations in one order
            self._queue.join()
            with self._running:
                self._comm.stream = torch.cuda.current_stream(cuda.device).cuda_stream
                try:
                    self._execute(fn, [work], what, ms)
                finally:
                    self._comm.stream = None
            return work
        if self._blocking and self._queue.unfinished_tasks == 0:
            # the caller waits at once and the worker is idle: run it here (the C call releases
            # the GIL), which saves two thread hand-offs per call; under the lock the worker
            # takes too, so that operations from several threads still run one at a time
            with self._running:
                self._execute(fn, [work], what, ms)
            return work
        self._queue.put((fn, [work], what, ms))
        return work

    # ---- coalescing (dist._coalescing_manager, batch_isend_irecv) ------------------------

    def start_coalescing(self):
        if self._coalesced is not None:
            raise RuntimeError("oxccl backend: start_coalescing called twice without end_coalescing")
        self._coalesced = []

    def end_coalescing(self):
        if self._coalesced is None:
            raise RuntimeError("oxccl backend: end_coalescing without start_coalescing")
        jobs, self._coalesced = self._coalesced, None
        fns = [fn for fn, _ in jobs]

        def run():
            with _ox.group():
                for fn in fns:
                    fn()

        what, ms = f"a coalesced group of {len(fns)} operations", self._ms()
        work = _EXT.new_work(self._rank, [], ms, False, what)
        works = [w for _, w in jobs] + [work]
        if any(cuda_tensor(w.result()) is not None for w in works):
            self._queue.join()
            with self._running:
                self._execute(run, works, what, ms)
        else:
            self._queue.put((run, works, what, ms))
        return work

    # ---- monitored barrier (gloo's semantics, through the group's store) -----------------

    def monitored_barrier(self, timeout_ms, wait_all_ranks):
        """Every rank checks in with rank 0, which names the ranks that did not arrive within
        the timeout; then rank 0 releases the others. Through the store, so that a missing rank
        leaves no half-done operation in the communicator."""
        self._monitored += 1
        key = f"oxccl_monitored/{self._monitored}"
        ms = self._ms(timeout_ms) if timeout_ms != 0 else 0
        if self._rank != 0:
            self._store.set(f"{key}/arrived/{self._rank}", "1")
            try:
                self._store.wait([f"{key}/released"], timedelta(milliseconds=max(ms, 1)))
            except Exception as e:  # noqa: BLE001 - reworded as gloo's
                raise RuntimeError(
                    f"Rank {self._rank} successfully reached monitoredBarrier, but received errors while waiting "
                    f"for send/recv from rank 0. Please check rank 0 logs for faulty rank. ({e})"
                ) from None
            return
        deadline = time.monotonic() + ms / 1000
        missing = []
        for r in range(1, self._size):
            left = deadline - time.monotonic()
            if left <= 0 and not missing:
                raise RuntimeError(f"Rank 0 timed out in monitoredBarrier after {ms} ms")
            try:
                self._store.wait([f"{key}/arrived/{r}"], timedelta(seconds=max(left, 0.001)))
            except Exception:  # noqa: BLE001 - the rank did not arrive
                missing.append(r)
                if not wait_all_ranks:
                    break
        if missing:
            who = f"Rank {missing[0]}" if len(missing) == 1 else "Ranks " + ", ".join(map(str, missing))
            raise RuntimeError(f"[Rank 0]: {who} failed to pass monitoredBarrier in {ms} ms")
        self._store.set(f"{key}/released", "1")

    # ---- life cycle ---------------------------------------------------------------------

    def set_timeout(self, timeout_ms):
        # torch's per-group timeout change applies to the Works made from now on (the
        # communicator keeps the bound it was created with)
        self._timeout = timedelta(milliseconds=timeout_ms)

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
            # the aborted operations fail at once; wait (bounded) for the worker to hand them
            # over and end, so that a process leaving right after the abort does not finalize
            # the interpreter under a worker still completing them (which would abort it)
            if threading.current_thread() is not self._worker:
                self._worker.join(timeout=min(10.0, self._timeout.total_seconds()))


def _group_of(impl, store, name):
    """A ProcessGroup whose CPU and CUDA backend is ``impl`` (as dist.shrink_group builds one)."""
    backend = _EXT.new_backend(impl.rank(), impl.size(), impl)
    pg = dist.ProcessGroup(store, impl.rank(), impl.size())
    for dev in ("cpu", "cuda"):
        pg._register_backend(torch.device(dev), dist.ProcessGroup.BackendType.CUSTOM, backend)
    pg._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)
    pg._set_group_name(name)
    return pg


def shrink_group(ranks_to_exclude, group=None, shrink_flags=0, pg_options=None):
    """``dist.shrink_group``, and the new group's backend registered as what it is (a custom
    backend): torch registers a shrunk CPU group's backend as gloo's, and DDP's logger then
    treats ours as a ProcessGroupGloo and crashes (torch 2.15)."""
    pg = dist.shrink_group(ranks_to_exclude, group=group, shrink_flags=shrink_flags, pg_options=pg_options)
    backend = pg._get_backend(torch.device("cpu"))
    _EXT.backend_impl(backend)  # ours (raises otherwise)
    for dev in ("cpu", "cuda"):
        pg._register_backend(torch.device(dev), dist.ProcessGroup.BackendType.CUSTOM, backend)
    pg._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)
    return pg


def grow_id(group=None):
    """On one member: the single-use id of the next grow (``ncclCommGetUniqueId``); hand it to
    the newcomers out of band (the job's store, say)."""
    return backend_impl(group).grow_id()


def grow_group(nranks, store, group=None, unique_id=None, name="oxccl_grown"):
    """Grow ``group`` (default: the world) to ``nranks`` ranks, as a member: every member calls
    it and keeps its rank; the one that made the id may pass it. ``store`` and ``name`` are the
    new group's, the same on the newcomers (``join_grown_group``). Returns a ProcessGroup: pass
    it as ``group=`` or to DDP."""
    store = dist.PrefixStore(f"{name}/", store)
    impl = backend_impl(group).grow(nranks, unique_id, store)
    return _group_of(impl, store, name)


def join_grown_group(unique_id, nranks, rank, store, timeout=timedelta(seconds=600), name="oxccl_grown"):
    """A newcomer's side of ``grow_group``: no process group needed, only the id, a rank from
    the old size up, and the new group's ``store`` and ``name``."""
    store = dist.PrefixStore(f"{name}/", store)
    comm = _ox.Comm.join_grow(nranks, unique_id, rank)
    return _group_of(Impl(store, rank, nranks, timeout, comm=comm), store, name)


def backend_impl(group=None):
    """The Python implementation behind an ``"oxccl"`` group's backend (for tests and tools)."""
    pg = group or dist.group.WORLD
    return _EXT.backend_impl(pg._get_backend(torch.device("cpu")))


def _create(opts, _options):
    """The extended creator: torch's ``enable_reconfigure`` reaches the backend."""
    reconf = bool(getattr(opts, "enable_reconfigure", False))
    impl = Impl(opts.store, opts.group_rank, opts.group_size, opts.timeout, reconfigure=reconf)
    return _EXT.new_backend(opts.group_rank, opts.group_size, impl)


def register():
    """Register the ``"oxccl"`` backend for CPU and CUDA tensors (done on import)."""
    if "oxccl" not in dist.Backend.backend_list:
        dist.Backend.register_backend("oxccl", _create, extended_api=True, devices=["cpu", "cuda"])


register()
