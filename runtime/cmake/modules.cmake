# Extra dependencies of runtime modules, added to hora_objects (included by runtime/CMakeLists.txt).

# --- ckpt ---
# jansson writes and parses the safetensors JSON header and the manifest.
find_package(PkgConfig REQUIRED)
pkg_check_modules(JANSSON REQUIRED IMPORTED_TARGET jansson)
target_link_libraries(hora_objects PUBLIC PkgConfig::JANSSON)

# --- data ---
# zlib reads gzip-compressed IDX files (MNIST, Fashion-MNIST) for `hora-records convert-idx`.
find_package(ZLIB)
if(NOT ZLIB_FOUND)
  message(FATAL_ERROR "zlib was not found (apt-get install zlib1g-dev): runtime/data needs it")
endif()
target_link_libraries(hora_objects PUBLIC ZLIB::ZLIB)

# --- trace ---

# --- comm (gpu) ---

# --- engine ---
# jansson (linked in the ckpt section above) escapes tensor names in the timeline
# (runtime/engine/timeline.c).
