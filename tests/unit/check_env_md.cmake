# Fails when docs/env.md differs from `hora-info env-md` (regenerate with
# `build/bin/hora-info env-md > docs/env.md`).
execute_process(COMMAND ${INFO} env-md OUTPUT_VARIABLE gen RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "hora-info env-md failed: ${rc}")
endif()
file(READ ${DOC} doc)
if(NOT gen STREQUAL doc)
  message(FATAL_ERROR "docs/env.md is out of date with runtime/core/params.def: run `build/bin/hora-info env-md > docs/env.md`")
endif()
