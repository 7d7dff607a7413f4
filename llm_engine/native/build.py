"""Compile decode.cpp once per machine and load it with ctypes.

The library is built with the system C++ compiler for this CPU (-march=native) and cached under the user
cache dir, keyed by the source, the flags, the compiler and the CPU's feature flags, so a rebuild happens
only when one of them changes (~5 s on the 2-core machine). It links libgomp by soname, so inside a process that imported torch
it shares torch's OpenMP runtime (one thread pool, see threads.py for why that matters).
It knows nothing about models: decoder.py describes one to the library.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import threading
from pathlib import Path

import platformdirs

SOURCE = Path(__file__).with_name("decode.cpp")
HEADERS = tuple(sorted(SOURCE.parent.glob("*.h")))  # abi.h, matvec.h, int4_vnni.h, vec16.h
FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-fno-math-errno")


def flags() -> tuple[str, ...]:
    """FLAGS for this CPU; PARLEY_NATIVE_MARCH picks another target (the tests build the AVX2 and the plain
    x86-64 paths this way, so the kernels a CI machine may take are checked here too)."""
    return (*FLAGS, f"-march={os.environ.get('PARLEY_NATIVE_MARCH', 'native')}")


_lock = threading.Lock()
_loaded: ctypes.CDLL | None = None


class NativeUnavailable(RuntimeError):
    """The compiled decode step cannot be built or loaded here (the message says why)."""


def compiler() -> str:
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return name
    raise NativeUnavailable("no C++ compiler found (install g++, e.g. `apt-get install -y g++`, or set CXX)")


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return os.uname().machine


def library_path(cxx: str) -> Path:
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout
    key = hashlib.sha256("\0".join([*(p.read_text() for p in (SOURCE, *HEADERS)), " ".join(flags()), version, _cpu_flags()]).encode()).hexdigest()[:16]
    return Path(platformdirs.user_cache_dir("parley")) / "native" / key / "libparley_decode.so"


def build(cxx: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".{os.getpid()}.tmp")
    result = subprocess.run([cxx, *flags(), str(SOURCE), "-o", str(tmp)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise NativeUnavailable(f"{cxx} could not build {SOURCE.name}:\n{result.stderr[-2000:]}")
    os.replace(tmp, target)  # atomic: a concurrent process sees the old file or the whole new one


def load() -> ctypes.CDLL:
    """-> the loaded library (built first if this machine has no copy); NativeUnavailable if it cannot be."""
    global _loaded
    with _lock:
        if _loaded is None:
            import torch  # noqa: F401 - torch's libgomp must be the one already in the process

            cxx = compiler()
            path = library_path(cxx)
            if not path.exists():
                build(cxx, path)
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as exc:
                raise NativeUnavailable(f"could not load {path}: {exc}") from exc
            lib.parley_abi.restype = ctypes.c_int32
            lib.parley_features.restype = ctypes.c_int32
            lib.parley_decode.restype = ctypes.c_int32
            lib.parley_decode.argtypes = [
                ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32
            ]
            lib.parley_forward.restype = ctypes.c_int32
            lib.parley_forward.argtypes = [*lib.parley_decode.argtypes, ctypes.c_int32]
            _loaded = lib
        return _loaded
