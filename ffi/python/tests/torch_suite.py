"""PyTorch's own distributed test suite (the one gloo and nccl are held to), run on a backend.

torch ships the suite in its wheel (``torch.testing._internal.distributed.distributed_test``);
PyTorch runs it through ``test/distributed/test_distributed_spawn.py``, which is not in the
wheel. This file is that runner: ``BACKEND=oxccl WORLD_SIZE=2 python -m pytest torch_suite.py``.

``OXCCL_SUITE_AS=gloo``: the suite's import-time decorators see the backend as gloo, so the
tests it reserves for gloo by name (coalesced all-reduce, sparse, monitored barrier, timeouts,
...) are not skipped; the ranks still run on ``BACKEND``. Those that then fail only because they
assert something of gloo itself are listed, with the reason, in ``torch_suite_expected.txt``.
"""

import os
import sys
import tempfile

os.environ.setdefault("BACKEND", "oxccl")
os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="oxccl-suite-"))

import torch.distributed as dist  # noqa: E402

_BACKEND = os.environ["BACKEND"]
_AS = os.environ.get("OXCCL_SUITE_AS")
if _AS:
    os.environ["BACKEND"] = _AS  # read once, by the suite's module, at its import

if _BACKEND == "oxccl":
    import oxccl.torch  # noqa: E402,F401  (registers the backend)

from torch.testing._internal.common_utils import run_tests  # noqa: E402
import torch.testing._internal.distributed.distributed_test as _suite  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

if _AS:
    # the ranks and the tests' bodies use the real backend
    os.environ["BACKEND"] = _BACKEND
    _suite.BACKEND = _BACKEND

assert dist.is_available()


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        if os.environ.get("OXCCL_SUITE_START", "fork") == "spawn":
            self._spawn_processes()  # as test_distributed_spawn.py: each rank imports torch anew
        else:
            # as PyTorch's former test_distributed_fork.py: the ranks start in milliseconds
            # instead of seconds, which makes the suite fit in CI
            import torch.multiprocessing

            self._start_processes(torch.multiprocessing.get_context("fork").Process)


if __name__ == "__main__":
    run_tests()
