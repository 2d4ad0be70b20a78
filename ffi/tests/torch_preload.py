"""PyTorch loads oxccl's libnccl.so.2 in place of NVIDIA's, and calls into it.

Run as `LD_PRELOAD=target/release/libnccl.so.2 python ffi/tests/torch_preload.py` with a CUDA
build of torch (no GPU needed). It checks that:
- `import torch` succeeds (every nccl symbol libtorch_cuda.so imports resolves to oxccl);
- `torch.distributed.is_nccl_available()` is true;
- torch's calls reach oxccl: `torch.cuda.nccl.unique_id()` (torch's own ncclGetUniqueId call)
  returns an id that oxccl's ncclCommInitRank accepts (NVIDIA's ids are refused by it), and,
  where torch has it, `ProcessGroupNCCL.get_runtime_nccl_version()` (torch's ncclGetVersion call)
  equals oxccl's ncclGetVersion.
`torch.cuda.nccl.version()` is printed too, but it is the NCCL version torch was *built* against
(a constant compiled into torch), so it cannot show which library is loaded.
"""

import ctypes
import os
import sys


def main() -> int:
    pre = os.environ.get("LD_PRELOAD", "")
    if "libnccl" not in pre:
        print("run with LD_PRELOAD=<oxccl's libnccl.so.2>", file=sys.stderr)
        return 2
    import torch  # the check itself: this fails on any missing symbol
    import torch.distributed as dist

    lib = ctypes.CDLL(pre.split(":")[0])
    v = ctypes.c_int()
    assert lib.ncclGetVersion(ctypes.byref(v)) == 0
    ours = (v.value // 10000, v.value % 10000 // 100, v.value % 100)
    assert dist.is_nccl_available(), "torch.distributed.is_nccl_available() is False"
    built = torch.cuda.nccl.version()
    runtime = None
    pg = getattr(torch._C._distributed_c10d, "ProcessGroupNCCL", None)
    if pg is not None and hasattr(pg, "get_runtime_nccl_version"):
        runtime = tuple(pg.get_runtime_nccl_version())
        assert runtime == ours, f"torch's ncclGetVersion gave {runtime}, oxccl's is {ours}"
    uid = torch.cuda.nccl.unique_id()
    assert len(uid) == 128, len(uid)
    # oxccl accepts only its own ids: torch's ncclGetUniqueId call was served by oxccl
    class UniqueId(ctypes.Structure):
        _fields_ = [("internal", ctypes.c_char * 128)]

    comm = ctypes.c_void_p()
    rc = lib.ncclCommInitRank(ctypes.byref(comm), 1, UniqueId.from_buffer_copy(uid), 0)
    assert rc == 0, f"oxccl refused the id torch made (rc {rc}): torch did not call oxccl"
    assert lib.ncclCommDestroy(comm) == 0
    print(
        f"torch {torch.__version__}: import ok with oxccl preloaded; is_nccl_available True; "
        f"oxccl's ncclGetVersion {'.'.join(map(str, ours))}; torch's runtime ncclGetVersion "
        f"{'.'.join(map(str, runtime)) if runtime else 'not exposed by this torch'}; "
        f"torch.cuda.nccl.version() {'.'.join(map(str, built))} (torch's build-time NCCL); "
        f"torch.cuda.nccl.unique_id() came from oxccl"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
