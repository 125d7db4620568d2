# Installs a customconv build into a fresh prefix, then configures, builds and
# runs the consumer project (this folder) against that prefix, as a downstream
# user would. Run by ctest (tests/CMakeLists.txt):
#
#   cmake -DBUILD_DIR=<customconv build> -DWORK_DIR=<scratch folder>
#         -DGENERATOR=<CMake generator> -DMODEL=<m.pt> -DINPUTS=<in.pt> -DEXPECTED=<out.pt>
#         -P run_consumer.cmake

foreach(var BUILD_DIR WORK_DIR GENERATOR MODEL INPUTS EXPECTED)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_consumer.cmake: -D${var}=... is required")
  endif()
endforeach()

function(run)
  message(STATUS "run_consumer: ${ARGN}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "run_consumer: failed (${status}): ${ARGN}")
  endif()
endfunction()

set(prefix ${WORK_DIR}/prefix)
set(consumer_build ${WORK_DIR}/build)
file(REMOVE_RECURSE ${prefix})

run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
# Only the install prefix: the consumer's CMakeLists.txt needs nothing else.
run(${CMAKE_COMMAND} -S ${CMAKE_CURRENT_LIST_DIR} -B ${consumer_build} -G ${GENERATOR}
    -DCMAKE_PREFIX_PATH=${prefix})
run(${CMAKE_COMMAND} --build ${consumer_build})
run(${consumer_build}/consumer ${MODEL} ${INPUTS} ${EXPECTED})
