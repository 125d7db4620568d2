# Installs a customconv build into a fresh prefix, then configures, builds and
# runs the consumer project (this folder) against that prefix, as a downstream
# user would. The consumer and the installed customconv_demo (when the build
# has it) run in a clean environment (no LD_LIBRARY_PATH, no PYTHONPATH): the
# installed files find libcustomconv and libtorch through their RPATH alone.
# Run by ctest (tests/CMakeLists.txt):
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
# A clean environment: only a PATH for the shell tools.
set(clean_env env -i PATH=/usr/bin:/bin)
run(${clean_env} ${consumer_build}/consumer ${MODEL} ${INPUTS} ${EXPECTED})

set(demo ${prefix}/bin/customconv_demo)
if(EXISTS ${demo})
  run(${clean_env} ${demo} --help)
  run(${clean_env} ${demo} --model ${MODEL} --inputs ${INPUTS} --expected ${EXPECTED}
      --device cpu --threads 2 --iters 4)
endif()
