# Builds the kernel library: moe-compile compiles each of LAYERS (a
# comma-separated list of "FILE[|OPTION...]") with its kernel cache pointed at
# LIBRARY (emptied first, so no stale binaries stay), then STAMP is written.
# Each kernel is an entry of its own, so together the layers leave one for
# every kernel of the library's default configs. A failed compile warns and
# leaves the library empty: moe-compile then builds the kernels at a
# machine's first compile, as without a library.
#   cmake -DMOE_COMPILE=... -DPTXAS=... -DLAYERS=... -DLIBRARY=... -DWORK=...
#         -DSTAMP=... -P BuildKernelLibrary.cmake
file(REMOVE_RECURSE "${LIBRARY}" "${WORK}")
file(MAKE_DIRECTORY "${LIBRARY}" "${WORK}")
get_filename_component(ptxas_dir "${PTXAS}" DIRECTORY)
set(ENV{PATH} "${ptxas_dir}:$ENV{PATH}")
set(result 0)
string(REPLACE "," ";" layers "${LAYERS}")
foreach(layer IN LISTS layers)
  string(REPLACE "|" ";" arguments "${layer}")
  execute_process(
    COMMAND "${MOE_COMPILE}" ${arguments} --format=bin
            "--kernel-cache=${LIBRARY}" --kernel-library=none --emit=obj
            -o "${WORK}/layer"
    RESULT_VARIABLE result
    OUTPUT_VARIABLE output
    ERROR_VARIABLE output)
  if(NOT result EQUAL 0)
    break()
  endif()
endforeach()
file(REMOVE_RECURSE "${WORK}")
if(NOT result EQUAL 0)
  file(REMOVE_RECURSE "${LIBRARY}")
  file(MAKE_DIRECTORY "${LIBRARY}")
  message(WARNING "moe-mlir: the kernel library was not built (moe-compile "
                  "exit ${result}): ${output}")
endif()
file(WRITE "${STAMP}" "${result}\n")
