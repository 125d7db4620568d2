# The pip package (pyproject.toml, scikit-build-core sets SKBUILD): the library
# goes into the Python package `customconv`, next to its __init__.py, where
# customconv/_library.py looks for it. Installed as one plain file (a wheel
# cannot hold the SONAME symlinks) that finds libtorch in the torch package
# beside it in site-packages.
set_property(TARGET customconv PROPERTY VERSION)
set_property(TARGET customconv PROPERTY SOVERSION)
set_property(TARGET customconv PROPERTY INSTALL_RPATH "$ORIGIN/../torch/lib")
install(TARGETS customconv LIBRARY DESTINATION customconv COMPONENT python)
