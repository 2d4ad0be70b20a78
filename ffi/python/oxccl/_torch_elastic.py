"""The torch backend's fault tolerance: ``errored()``, shrink, grow and reconfigure (a mixin of
``oxccl.torch.Impl``, over ``ncclCommShrink``, ``ncclCommGrow`` and derived unique ids)."""

from datetime import timedelta

import torch.distributed as dist

import oxccl as _ox


class Elastic:
    """Needs the Impl's communicator, store, queue and worker (see ``oxccl.torch.Impl``)."""

    def error_type(self):
        """c10d's ErrorType of the first failed operation (0: none, 1: timeout, 2: this rank's
        communicator, 3: a peer), for ``errored()``."""
        return self._error

    # ---- shrink and grow ----------------------------------------------------------------

    def _child(self, comm, store):
        return type(self)(store, comm.rank(), comm.size(), self._timeout, comm=comm)

    def _live(self):
        if self._comm is None:
            raise RuntimeError("oxccl backend: the process group was shut down or aborted")
        return self._comm

    def shrink(self, ranks_to_exclude, shrink_flags):
        """dist.shrink_group: SHRINK_DEFAULT lets queued operations finish first; SHRINK_ABORT
        revokes them (they fail), as after a peer died."""
        comm = self._live()
        abort = bool(shrink_flags & 1)
        if not abort:
            self._queue.join()
        self._changes += 1
        store = dist.PrefixStore(f"oxccl_shrink{self._changes}/", self._store)
        return self._child(comm.shrink(list(ranks_to_exclude), abort=abort), store)

    def grow(self, nranks, unique_id, store):
        """A member's part of ``grow_group`` (``store``: the new group's, as the newcomers')."""
        comm = self._live()
        self._queue.join()
        return self._child(comm.grow(nranks, unique_id), store)

    def grow_id(self):
        return self._live().grow_id()

    # ---- torch's reconfigure (dist._reconfigure) ----------------------------------------

    def get_reconfigure_handle(self):
        """This rank's handle: a unique id whose store this process serves (made once). Every
        instance meets on the first handle's store, in a namespace derived from its uuid."""
        if self._handle is None:
            self._handle = _ox.get_unique_id().hex()
        return self._handle

    def reconfigure(self, uuid, handles, ordered, timeout_ms):
        """(Re)build the communicator of ``handles``' ranks: a list gives the ranks by position,
        a set is sorted. The old communicator is aborted first (what runs on it fails). Returns a
        completed Work; a failure raises."""
        hs = list(handles) if ordered else sorted(handles)
        if self._handle is None or self._handle not in hs:
            raise RuntimeError("oxccl backend: reconfigure needs this rank's get_reconfigure_handle() among the handles")
        if len(set(hs)) != len(hs):
            raise ValueError("oxccl backend: reconfigure: a handle is listed twice")
        timeout = timedelta(milliseconds=timeout_ms) if timeout_ms and timeout_ms > 0 else self._timeout
        if self._comm is not None:
            comm, self._comm = self._comm, None
            comm.abort()
            self._queue.put(None)
            self._worker.join(timeout=timeout.total_seconds())
        uid = _ox.derive_unique_id(bytes.fromhex(hs[0]), uuid)
        rank, size = hs.index(self._handle), len(hs)
        self._comm = _ox.Comm.init_rank(size, uid, rank, timeout=max(1.0, timeout.total_seconds()))
        self._rank, self._size, self._error, self._timeout = rank, size, 0, timeout
        self._store, self._monitored = dist.PrefixStore(f"oxccl_reconfigure{uuid}/", self._base_store), 0
        if not self._worker.is_alive():
            self._start_worker()
        work = self._ext.new_work(rank, [], int(timeout.total_seconds() * 1000), False, "reconfigure")
        self._ext.complete(work, None)
        return work
