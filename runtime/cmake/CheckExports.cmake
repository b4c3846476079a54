# Fails unless every dynamic symbol that LIBRARY defines is part of the C
# API (moe*) or the mgpu* ABI.
#
# cmake -DNM=nm -DLIBRARY=libmoe_runtime.so -P CheckExports.cmake

execute_process(COMMAND ${NM} -D --defined-only "${LIBRARY}"
  OUTPUT_VARIABLE symbols RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "${NM} failed on ${LIBRARY}")
endif()
string(REPLACE "\n" ";" lines "${symbols}")
set(count 0)
set(bad "")
foreach(line IN LISTS lines)
  # "<address> <type> <name>"; only code and data count.
  if(line MATCHES "^[0-9a-fA-F]+ [TDBRVW] ([^ ]+)$")
    set(name ${CMAKE_MATCH_1})
    if(name MATCHES "^(moe|mgpu)[A-Z]")
      math(EXPR count "${count} + 1")
    elseif(NOT name MATCHES "^(_init|_fini|_edata|_end|__bss_start)$")
      list(APPEND bad ${name})
    endif()
  endif()
endforeach()
if(bad)
  message(FATAL_ERROR "libmoe_runtime exports non-API symbols: ${bad}")
endif()
if(count EQUAL 0)
  message(FATAL_ERROR "libmoe_runtime exports no moe*/mgpu* symbol")
endif()
message(STATUS "libmoe_runtime exports ${count} API symbols and nothing else")
