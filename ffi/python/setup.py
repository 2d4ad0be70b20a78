"""Build hook: compile oxccl's C ABI (libnccl.so.2) with cargo and bundle it in the package.

`pip install ./ffi/python` runs this in the source tree (pip builds in place), so the workspace
two levels up is at hand. With OXCCL_LIBRARY set to an already built libnccl.so, that file is
bundled instead and cargo is not needed.

Where torch is installed in the target environment, the torch backend's C++ part
(oxccl/_torch_ext.cpp) is compiled against it too, and a failure fails the install with the
compiler's message. Without torch it is skipped: `import oxccl.torch` builds it later.
"""
import os
import pathlib
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent


class BuildWithRust(build_py):
    def run(self):
        super().run()
        lib = os.environ.get("OXCCL_LIBRARY")
        if not lib:
            subprocess.check_call(["cargo", "build", "--release", "-p", "oxccl-ffi"], cwd=ROOT)
            lib = ROOT / "target" / "release" / "libnccl.so"
        dest = pathlib.Path(self.build_lib) / "oxccl" / "lib"
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(lib, dest / "libnccl.so.2")
        # the release build carries its debug info (~30 MB); the package ships without it
        strip = shutil.which("strip")
        if strip:
            subprocess.check_call([strip, "--strip-debug", str(dest / "libnccl.so.2")])
        else:
            print("oxccl: no strip(1) here: the bundled libnccl.so.2 keeps its debug info")
        build_torch_ext(dest)


def build_torch_ext(dest):
    """Compile the torch backend's C++ part against the target environment's torch."""
    dest = pathlib.Path(dest).resolve()  # the compiler runs from /
    # pip's isolated build hides the target environment's packages (through PYTHONPATH); the
    # same interpreter without it sees them, torch included
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME")}
    probe = subprocess.run([sys.executable, "-c", "import torch"], env=env, cwd="/", capture_output=True)
    if probe.returncode != 0:
        print("oxccl: torch is not installed here; the torch backend's C++ part is built at its first import")
        return
    # run_path, not `python oxccl/_ext.py`: that would put oxccl/ first on sys.path, where
    # oxccl/torch.py shadows torch
    script = f"import runpy, sys; sys.argv = ['_ext', {str(dest)!r}]; runpy.run_path({str(HERE / 'oxccl' / '_ext.py')!r}, run_name='__main__')"
    r = subprocess.run([sys.executable, "-c", script], env=env, cwd="/", capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"oxccl: could not build the torch backend against the installed torch:\n{r.stderr[-3000:]}")
    print(f"oxccl: built the torch backend: {r.stdout.strip()}")


class BinaryDistribution(Distribution):
    """The wheel carries a native library: tag it for this platform."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithRust}, distclass=BinaryDistribution)
