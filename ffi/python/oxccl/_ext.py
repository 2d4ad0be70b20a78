"""The torch backend's C++ shell (``_torch_ext.cpp``), built against the torch in use.

``pip install`` builds it when torch is installed in the target environment (setup.py); otherwise,
or after torch was upgraded, the first ``import oxccl.torch`` builds it (about a minute) into
``$OXCCL_TORCH_EXT_DIR`` (default ``~/.cache/oxccl/torch-ext``), once per torch version. Both
need a C++ compiler; without one the import fails and says so.
"""

import hashlib
import importlib.util
import os
import pathlib
import shutil
import sys

HERE = pathlib.Path(__file__).resolve().parent
SOURCE = HERE / "_torch_ext.cpp"


def tag():
    """Module name for this source and this torch (a build for another torch is not reused)."""
    import torch

    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(torch.__version__.encode())
    h.update(sys.version.encode())
    return "oxccl_torch_" + h.hexdigest()[:16]


def build(directory):
    """Compile the extension into `directory` with the C++ compiler; returns the module's path."""
    import subprocess
    import sysconfig
    import tempfile

    import torch
    from torch.utils import cpp_extension

    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        raise RuntimeError(
            f"oxccl: building the torch backend needs a C++ compiler ({cxx}, or set $CXX); "
            "install one (e.g. apt-get install g++) and import oxccl.torch again"
        )
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    name = tag()
    abi = getattr(cpp_extension, "_get_pybind11_abi_build_flags", lambda: [])
    flags = ["-O2", "-fPIC", "-shared", "-std=c++20", "-w", f"-DTORCH_EXTENSION_NAME={name}"]
    flags += ["-DTORCH_API_INCLUDE_EXTENSION_H", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
    flags += list(abi())
    flags += [f"-I{p}" for p in cpp_extension.include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
    libs = []
    for p in cpp_extension.library_paths():
        libs += [f"-L{p}", f"-Wl,-rpath,{p}"]
    libs += ["-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]
    # built beside, then renamed: a concurrent import never loads a half-written file
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        out = pathlib.Path(tmp) / f"{name}.so"
        cmd = [cxx, *flags, str(SOURCE), "-o", str(out), *libs]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            errors = [line for line in r.stderr.splitlines() if "error" in line][:20]
            raise RuntimeError(f"oxccl: compiling {SOURCE.name} with {cxx} failed:\n" + "\n".join(errors))
        os.replace(out, directory / f"{name}.so")
    return directory / f"{name}.so"


def _import(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load():
    """The extension module: the one built at install, else one from (or built into) the cache."""
    name = tag()
    prebuilt = HERE / "lib" / f"{name}.so"
    if prebuilt.exists():
        return _import(prebuilt, name)
    cache = pathlib.Path(os.environ.get("OXCCL_TORCH_EXT_DIR", pathlib.Path.home() / ".cache" / "oxccl" / "torch-ext"))
    path = cache / f"{name}.so"
    if path.exists():
        return _import(path, name)
    try:
        build(cache)
    except Exception as e:  # noqa: BLE001 - re-raised with what to do
        raise RuntimeError(f"oxccl: could not build the torch backend's C++ part against torch in {cache}: {e}") from e
    return _import(path, name)


if __name__ == "__main__":
    # setup.py runs this file (runpy.run_path) with DIR: builds into DIR against its torch
    print(build(sys.argv[1]))
