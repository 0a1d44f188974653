"""cffi build script of the `hora` package (API, out-of-line mode).

It compiles the extension module `hora._hora_cffi` against libhora's public header and the built or
installed library. The declarations given to cffi are not copied by hand: they are the region of
runtime/include/hora.h between `/* HORA_CDEF_BEGIN */` and `/* HORA_CDEF_END */`, which the header
keeps plain C for this purpose (no #ifdef, no attributes, integer #defines only).

Where libhora is looked for, first match wins:
  1. HORA_BUILD_DIR: a CMake build tree of hora (headers from its source tree, read from
     CMakeCache.txt, plus <build>/include; library <build>/lib/libhora.so).
  2. HORA_PREFIX: an install prefix (<prefix>/include/hora.h, <prefix>/lib*/libhora.so).
  3. pkg-config hora (PKG_CONFIG_PATH=<prefix>/lib/pkgconfig after `cmake --install`).
  4. The build tree `build/` next to this python/ folder (an in-tree `cmake -B build`).
The extension gets an rpath to the library's folder, so no LD_LIBRARY_PATH is needed.

Used by python/CMakeLists.txt (`pip install ./python`, through scikit-build-core), which runs
`python hora_build.py --emit-c FILE --header hora.h` and compiles FILE as the extension module
itself, and by tests/python/CMakeLists.txt, which runs
`python3 hora_build.py --build-dir BUILD --out DIR` to put an importable package under DIR.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
BEGIN = "/* HORA_CDEF_BEGIN */"
END = "/* HORA_CDEF_END */"

# DLPack's C ABI (dmlc/dlpack, include/dlpack/dlpack.h, the unversioned "dltensor" capsule that
# every producer supports). Only read by hora: the producer keeps ownership of the memory.
DLPACK_DECLS = """
typedef struct { int32_t device_type; int32_t device_id; } hora_py_dldevice_t;
typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } hora_py_dldtype_t;
typedef struct {
  void *data;
  hora_py_dldevice_t device;
  int32_t ndim;
  hora_py_dldtype_t dtype;
  int64_t *shape;
  int64_t *strides;
  uint64_t byte_offset;
} hora_py_dltensor_t;
typedef struct hora_py_dlmanaged {
  hora_py_dltensor_t dl_tensor;
  void *manager_ctx;
  void (*deleter)(struct hora_py_dlmanaged *self);
} hora_py_dlmanaged_t;
"""


class HoraNotFound(RuntimeError):
    pass


def _cmake_source_dir(build_dir):
    cache = os.path.join(build_dir, "CMakeCache.txt")
    if not os.path.exists(cache):
        return None
    with open(cache) as f:
        for line in f:
            if line.startswith(("hora_SOURCE_DIR:", "CMAKE_HOME_DIRECTORY:")):
                return line.split("=", 1)[1].strip()
    return None


def _from_build_dir(build_dir):
    build_dir = os.path.abspath(build_dir)
    src = _cmake_source_dir(build_dir)
    if not src:
        raise HoraNotFound(f"{build_dir} is not a CMake build tree of hora (no CMakeCache.txt)")
    libdir = os.path.join(build_dir, "lib")
    if not glob.glob(os.path.join(libdir, "libhora.so*")):
        raise HoraNotFound(f"{libdir}/libhora.so does not exist: build it first "
                           f"(cmake --build {build_dir} --target hora)")
    return [os.path.join(src, "runtime", "include"), os.path.join(build_dir, "include")], [libdir]


def _from_prefix(prefix):
    prefix = os.path.abspath(prefix)
    inc = os.path.join(prefix, "include")
    libdirs = [d for d in (os.path.join(prefix, x) for x in
                           ("lib", "lib64", "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu"))
               if glob.glob(os.path.join(d, "libhora.so*"))]
    if not os.path.exists(os.path.join(inc, "hora.h")) or not libdirs:
        raise HoraNotFound(f"HORA_PREFIX={prefix} has no include/hora.h and lib/libhora.so")
    return [inc], libdirs[:1]


def _from_pkg_config():
    try:
        out = subprocess.run(["pkg-config", "--cflags-only-I", "--libs-only-L", "hora"],
                             check=True, capture_output=True, text=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return None
    incs = [os.path.normpath(t[2:]) for t in out if t.startswith("-I")]
    libs = [os.path.normpath(t[2:]) for t in out if t.startswith("-L")]
    return incs, libs


def find_hora():
    """(include_dirs, library_dirs) of libhora; raises HoraNotFound with what to do."""
    if os.environ.get("HORA_BUILD_DIR"):
        return _from_build_dir(os.environ["HORA_BUILD_DIR"])
    if os.environ.get("HORA_PREFIX"):
        return _from_prefix(os.environ["HORA_PREFIX"])
    found = _from_pkg_config()
    if found:
        return found
    intree = os.path.join(HERE, os.pardir, "build")
    if os.path.exists(os.path.join(intree, "CMakeCache.txt")):
        return _from_build_dir(intree)
    raise HoraNotFound(
        "libhora was not found. Build hora first (cmake -S . -B build && cmake --build build), "
        "then set HORA_BUILD_DIR=<build dir>, or HORA_PREFIX=<install prefix>, or make "
        "`pkg-config hora` work (PKG_CONFIG_PATH=<prefix>/lib/pkgconfig)")


def extract_cdef(header_text):
    """The cffi declarations: the header's HORA_CDEF region, comments removed, checked plain."""
    try:
        region = header_text.split(BEGIN, 1)[1].split(END, 1)[0]
    except IndexError:
        raise HoraNotFound(f"hora.h has no {BEGIN} ... {END} region") from None
    region = re.sub(r"/\*.*?\*/", " ", region, flags=re.S)
    region = re.sub(r"//[^\n]*", "", region)
    lines = []
    for line in region.splitlines():
        s = line.strip()
        if s.startswith("#"):
            # Integer #defines are the only directives cffi accepts in a cdef.
            if not re.fullmatch(r"#\s*define\s+\w+\s+\(?-?(0x[0-9a-fA-F]+|\d+)[uUlL]*\)?", s):
                raise HoraNotFound(f"hora.h cdef region has a directive cffi cannot parse: {s!r}")
        lines.append(line.rstrip())
    return "\n".join(lines)


def make_ffibuilder(include_dirs=None, library_dirs=None, header=None):
    if include_dirs is None:
        include_dirs, library_dirs = find_hora()
    if header is None:
        header = next((os.path.join(d, "hora.h") for d in include_dirs
                       if os.path.exists(os.path.join(d, "hora.h"))), None)
    if header is None:
        raise HoraNotFound(f"hora.h not found in {include_dirs}")
    with open(header) as f:
        cdef = extract_cdef(f.read())
    ffibuilder = FFI()
    ffibuilder.cdef(cdef)
    ffibuilder.cdef(DLPACK_DECLS)
    # The version of the libhora the extension is built against (hora/version.h, generated from
    # the repository's VERSION file): hora.__version__, one number for C, CMake and Python.
    ffibuilder.cdef("#define HORA_VERSION_MAJOR ...\n#define HORA_VERSION_MINOR ...\n"
                    "#define HORA_VERSION_PATCH ...\n")
    ffibuilder.set_source(
        "hora._hora_cffi",
        "#include <hora.h>\n" + DLPACK_DECLS,
        include_dirs=include_dirs,
        library_dirs=library_dirs,
        runtime_library_dirs=library_dirs,
        libraries=["hora"],
        extra_compile_args=["-O2"],
    )
    return ffibuilder


def _replace(src, dst_dir):
    """Copy src into dst_dir under a temporary name, then rename it over the old file. A copy in
    place (shutil.copy2 onto the old file) would rewrite the pages of an extension that running
    processes have mapped: a rebuild while a job runs made its ranks crash in cffi (SIGSEGV)."""
    dst = os.path.join(dst_dir, os.path.basename(src))
    tmp = f"{dst}.tmp.{os.getpid()}"
    try:
        shutil.copy2(src, tmp)
        os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def main():
    p = argparse.ArgumentParser(description="Build hora's cffi extension into an importable tree.")
    p.add_argument("--build-dir", help="hora CMake build tree (default: as find_hora())")
    p.add_argument("--out", help="folder that receives hora/ with the extension")
    p.add_argument("--emit-c", metavar="FILE",
                   help="only write the extension's C source to FILE (CMake compiles it)")
    p.add_argument("--header", help="with --emit-c: the hora.h whose cdef region is used")
    a = p.parse_args()
    if a.emit_c:
        if not a.header or not os.path.exists(a.header):
            p.error(f"--emit-c needs --header pointing at hora.h (got {a.header!r})")
        make_ffibuilder([os.path.dirname(a.header)], [], header=a.header).emit_c_code(a.emit_c)
        return
    if not a.out:
        p.error("--out DIR is required (or --emit-c FILE)")
    if a.build_dir:
        incs, libs = _from_build_dir(a.build_dir)
    else:
        incs, libs = find_hora()
    out = os.path.abspath(a.out)
    pkg_src = os.path.join(HERE, "hora")
    pkg_dst = os.path.join(out, "hora")
    os.makedirs(pkg_dst, exist_ok=True)
    for f in glob.glob(os.path.join(pkg_src, "*.py")):
        _replace(f, pkg_dst)
    tmp = os.path.join(out, "cffi-tmp")
    so = make_ffibuilder(incs, libs).compile(tmpdir=tmp, verbose=False)
    _replace(so, pkg_dst)
    print(f"hora_build: {pkg_dst}/{os.path.basename(so)}")


if __name__ == "__main__":
    main()
