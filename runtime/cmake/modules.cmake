# Extra dependencies of runtime modules, added to hora_objects (included by runtime/CMakeLists.txt).

# --- ckpt ---

# --- data ---

# --- trace ---

# --- comm (gpu) ---

# --- engine ---
