"""`pip install .`: pyproject.toml builds the CMake project against the
installed torch and gives a package with libcustomconv.so inside, which
imports from any directory, with the CMake project's version.

The wheel is built without build isolation (against this torch), with nothing
downloaded (--no-index), and with the CMake options of the build that ctest
runs in (CUSTOMCONV_TEST_CUDA, CUSTOMCONV_TEST_CUDA_ARCHS and its C++
compiler CUSTOMCONV_TEST_CXX, set by tests/CMakeLists.txt: pip's environment
may name another one, g++ for c++). Its compile commands are then those of that build, so
where ccache is installed (`make deps` installs it) every object comes from
the cache that build filled and only the link runs; without ccache the wheel
compiles the library once more. Its build folder is kept next to the library
the other tests use, so a second run only rebuilds what changed."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import customconv

REPO = Path(__file__).resolve().parents[2]

CHECK_IMPORT = """
import importlib.metadata, pathlib, sys
import torch, torch.nn.functional as F
import customconv
site = pathlib.Path(sys.argv[1]).resolve()
assert customconv.LIBRARY_PATH == site / "customconv" / "libcustomconv.so", customconv.LIBRARY_PATH
assert customconv.__version__ == importlib.metadata.version("customconv"), customconv.__version__
x, w = torch.randn(2, 3, 9, 8, dtype=torch.float64), torch.randn(4, 3, 3, 3, dtype=torch.float64)
torch.testing.assert_close(customconv.conv2d(x, w, padding=1), F.conv2d(x, w, padding=1))
print(customconv.__version__)
"""


def pip(*args, cwd):
    result = subprocess.run([sys.executable, "-m", "pip", *args, "--no-index", "--no-deps",
                             "--disable-pip-version-check"],
                            cwd=cwd, capture_output=True, text=True)
    assert result.returncode == 0, f"pip {' '.join(args)}:\n{result.stdout}\n{result.stderr}"


def test_wheel_holds_the_library_and_imports_from_any_directory(tmp_path):
    pytest.importorskip("scikit_build_core", reason="pip install scikit-build-core (make deps)")
    build_dir = Path(os.environ.get("CUSTOMCONV_LIBRARY", customconv.LIBRARY_PATH)).parent / "pip-test"
    wheel_dir = tmp_path / "wheel"
    defines = [f"cmake.define.CUSTOMCONV_CUDA={os.environ.get('CUSTOMCONV_TEST_CUDA', 'OFF')}"]
    for var, define in (("CUSTOMCONV_TEST_CUDA_ARCHS", "CUSTOMCONV_CUDA_ARCHS"),
                        ("CUSTOMCONV_TEST_CXX", "CMAKE_CXX_COMPILER")):
        if os.environ.get(var):
            defines.append(f"cmake.define.{define}={os.environ[var]}")
    pip("wheel", ".", "--no-build-isolation", "-w", str(wheel_dir),
        *(arg for d in defines for arg in ("-C", d)), "-C", f"build-dir={build_dir}", cwd=REPO)
    (wheel,) = wheel_dir.glob("customconv-*.whl")
    assert wheel.name.startswith(f"customconv-{customconv.__version__}-py3-none-")
    names = zipfile.ZipFile(wheel).namelist()
    assert "customconv/libcustomconv.so" in names and "customconv/__init__.py" in names

    site = tmp_path / "site"
    pip("install", "--target", str(site), str(wheel), cwd=tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("CUSTOMCONV_LIBRARY", "PYTHONPATH")}
    env["PYTHONPATH"] = str(site)
    result = subprocess.run([sys.executable, "-c", CHECK_IMPORT, str(site)], cwd=elsewhere,
                            env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == customconv.__version__
