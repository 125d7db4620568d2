"""One version everywhere: the CMake project's (CMakeLists.txt) is what the
library reports (customconv::version(), read here as customconv.__version__)
and what the CMake package's version file declares (find_package(customconv)).
The pip package's metadata version is checked in test_pip_install.py."""

import os
import re
from pathlib import Path

import customconv

REPO = Path(__file__).resolve().parents[2]


def cmake_project_version() -> str:
    text = (REPO / "CMakeLists.txt").read_text()
    match = re.search(r"project\(customconv VERSION ([0-9.]+)", text)
    assert match, "CMakeLists.txt: no `project(customconv VERSION ...)`"
    return match.group(1)


def test_python_version_is_the_cmake_project_version():
    assert re.fullmatch(r"\d+\.\d+\.\d+", customconv.__version__), customconv.__version__
    assert customconv.__version__ == cmake_project_version()


def test_cmake_package_version_is_the_libraries_version():
    # The version file of find_package(customconv), written next to the library
    # by the build that the tests run against.
    version_file = Path(os.environ.get("CUSTOMCONV_LIBRARY", customconv.LIBRARY_PATH)).parent \
        / "customconvConfigVersion.cmake"
    text = version_file.read_text()
    match = re.search(r'set\(PACKAGE_VERSION "([0-9.]+)"\)', text)
    assert match, f"{version_file}: no PACKAGE_VERSION"
    assert match.group(1) == customconv.__version__

