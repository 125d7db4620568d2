"""Finds and loads libcustomconv.so, which registers the ops with PyTorch."""

import ctypes
import os
from pathlib import Path

import torch

_LIBRARY_NAME = "libcustomconv.so"
_PACKAGE_DIR = Path(__file__).resolve().parent
_REPO_BUILD_DIR = _PACKAGE_DIR.parent.parent / "build"


def candidate_paths():
    """Where the library is looked for, in order."""
    env = os.environ.get("CUSTOMCONV_LIBRARY")
    if env:
        yield Path(env)
    yield _PACKAGE_DIR / _LIBRARY_NAME
    yield _REPO_BUILD_DIR / _LIBRARY_NAME


def load_library():
    """Loads the first library found and returns its path."""
    tried = []
    for path in candidate_paths():
        if path.is_file():
            torch.ops.load_library(str(path))
            return path
        tried.append(str(path))
    raise ImportError(
        "customconv: cannot find " + _LIBRARY_NAME + "; looked at " + ", ".join(tried)
        + ". Build it with `make build` (or `cmake --build build`), or set CUSTOMCONV_LIBRARY "
        "to its path."
    )


def library_version(path):
    """The version compiled into the library at `path` (customconv::version(),
    which is the CMake project's version)."""
    version = ctypes.CDLL(str(path)).customconv_version
    version.restype = ctypes.c_char_p
    return version().decode()
