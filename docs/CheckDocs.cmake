# Fails when a generated doc differs from its checked-in copy.
file(GLOB generated "${GENERATED_DIR}/*.md")
if(NOT generated)
  message(FATAL_ERROR "no generated docs in ${GENERATED_DIR}: build mlir-doc")
endif()
set(stale "")
foreach(path ${generated})
  get_filename_component(name ${path} NAME)
  execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${path}
                          ${CHECKED_IN_DIR}/${name}
                  RESULT_VARIABLE different)
  if(different)
    list(APPEND stale ${name})
  endif()
endforeach()
if(stale)
  message(FATAL_ERROR "docs/generated is stale for: ${stale}\n"
          "Run `ninja -C build moe-update-docs` and commit the result.")
endif()
message(STATUS "docs/generated matches the .td files")
