"""setup.py exists only to hand cffi's build script to setuptools (cffi_modules has no
pyproject.toml key); everything else is in pyproject.toml. See hora_build.py for how libhora is
found (HORA_BUILD_DIR, HORA_PREFIX, pkg-config hora, or ../build)."""
from setuptools import setup

setup(cffi_modules=["hora_build.py:ffibuilder_for_setup"])
