# Builds the kernel library: moe-compile compiles LAYER with its kernel cache
# pointed at LIBRARY (emptied first, so no stale binaries stay), then STAMP is
# written. A failed compile warns and leaves the library empty: moe-compile
# then builds the kernels at a machine's first compile, as without a library.
#   cmake -DMOE_COMPILE=... -DPTXAS=... -DLAYER=... -DLIBRARY=... -DWORK=...
#         -DSTAMP=... -P BuildKernelLibrary.cmake
file(REMOVE_RECURSE "${LIBRARY}" "${WORK}")
file(MAKE_DIRECTORY "${LIBRARY}" "${WORK}")
get_filename_component(ptxas_dir "${PTXAS}" DIRECTORY)
set(ENV{PATH} "${ptxas_dir}:$ENV{PATH}")
execute_process(
  COMMAND "${MOE_COMPILE}" "${LAYER}" --format=bin "--kernel-cache=${LIBRARY}"
          --kernel-library=none --emit=obj -o "${WORK}/layer"
  RESULT_VARIABLE result
  OUTPUT_VARIABLE output
  ERROR_VARIABLE output)
file(REMOVE_RECURSE "${WORK}")
if(NOT result EQUAL 0)
  file(REMOVE_RECURSE "${LIBRARY}")
  file(MAKE_DIRECTORY "${LIBRARY}")
  message(WARNING "moe-mlir: the kernel library was not built (moe-compile "
                  "exit ${result}): ${output}")
endif()
file(WRITE "${STAMP}" "${result}\n")
