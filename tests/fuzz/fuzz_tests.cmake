# The fuzz targets as tests (ctest -L fuzz), included by tests/CMakeLists.txt. They need clang
# and its libFuzzer runtime (Debian's clang, which scripts/install-deps.sh installs); without
# them one test says so and is reported as skipped, and the build goes on.
if(NOT GPURUN_BUILD_FUZZ)
  message(STATUS "gpurun: fuzz targets off (GPURUN_BUILD_FUZZ=OFF)")
  return()
endif()
find_program(GPURUN_FUZZ_CLANG NAMES clang++ clang++-14)
set(GPURUN_FUZZ_MISSING "")
if(NOT GPURUN_FUZZ_CLANG)
  set(GPURUN_FUZZ_MISSING "no clang++ on PATH (Debian: apt-get install clang)")
else()
  execute_process(COMMAND ${GPURUN_FUZZ_CLANG} -print-resource-dir
                  OUTPUT_VARIABLE GPURUN_FUZZ_RESOURCE_DIR OUTPUT_STRIP_TRAILING_WHITESPACE)
  set(GPURUN_FUZZ_RUNTIME
      ${GPURUN_FUZZ_RESOURCE_DIR}/lib/linux/libclang_rt.fuzzer-${CMAKE_SYSTEM_PROCESSOR}.a)
  if(NOT EXISTS ${GPURUN_FUZZ_RUNTIME})
    set(GPURUN_FUZZ_MISSING "${GPURUN_FUZZ_CLANG} has no libFuzzer (${GPURUN_FUZZ_RUNTIME})")
  endif()
endif()

set(GPURUN_FUZZ_TARGETS manifest config dataset pickle lease queue)
if(GPURUN_FUZZ_MISSING)
  message(STATUS "gpurun: fuzz tests skipped: ${GPURUN_FUZZ_MISSING}")
  add_test(NAME Fuzz.Skipped COMMAND ${CMAKE_COMMAND} -E echo
           "fuzz tests skipped: ${GPURUN_FUZZ_MISSING}")
  # ctest reports a test as skipped when its output matches SKIP_REGULAR_EXPRESSION.
  set_tests_properties(Fuzz.Skipped PROPERTIES LABELS fuzz SKIP_REGULAR_EXPRESSION "skipped")
  return()
endif()
message(STATUS "gpurun: fuzz targets with ${GPURUN_FUZZ_CLANG} (tests/fuzz)")

# A build of its own with clang (tests/fuzz/CMakeLists.txt says why), configured and built as
# part of this one; the same LibTorch and the same compiler cache.
include(ExternalProject)
cmake_host_system_information(RESULT GPURUN_CORES QUERY NUMBER_OF_LOGICAL_CORES)
set(GPURUN_FUZZ_JOBS ${GPURUN_CORES} CACHE STRING "parallel jobs of the fuzz targets' build")
set(GPURUN_FUZZ_BINARY_DIR ${CMAKE_CURRENT_BINARY_DIR}/fuzz-build)
set(GPURUN_FUZZ_BINARIES "")
foreach(target IN LISTS GPURUN_FUZZ_TARGETS)
  list(APPEND GPURUN_FUZZ_BINARIES ${GPURUN_FUZZ_BINARY_DIR}/${target}_fuzz)
endforeach()
ExternalProject_Add(gpurun_fuzz
  SOURCE_DIR ${CMAKE_CURRENT_SOURCE_DIR}/fuzz
  BINARY_DIR ${GPURUN_FUZZ_BINARY_DIR}
  CMAKE_ARGS -G ${CMAKE_GENERATOR} -DCMAKE_CXX_COMPILER=${GPURUN_FUZZ_CLANG}
             -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_PREFIX_PATH=${CMAKE_PREFIX_PATH}"
             -DCMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER}
             -DGPURUN_VERSION_STRING=${PROJECT_VERSION}
  # Its own Ninja, which knows nothing of the outer one's -j: as many jobs as cores unless told.
  BUILD_COMMAND ${CMAKE_COMMAND} --build <BINARY_DIR> -j ${GPURUN_FUZZ_JOBS}
  # Rebuilt whenever this build runs, so that a change to a parser reaches its target.
  BUILD_ALWAYS ON
  BUILD_BYPRODUCTS ${GPURUN_FUZZ_BINARIES}
  INSTALL_COMMAND "")

# LibTorch's zip reader leaks its directory when an archive fails to open (a few hundred bytes
# per damaged model.pt, in PyTorchStreamReader's constructor, not in gpurun): leaks are not
# findings of the pickle target, neither per input (libFuzzer) nor at exit (LeakSanitizer).
set(GPURUN_FUZZ_FLAGS_pickle -detect_leaks=0)
set(GPURUN_FUZZ_ENV_pickle ASAN_OPTIONS=detect_leaks=0)
foreach(target IN LISTS GPURUN_FUZZ_TARGETS)
  add_test(NAME Fuzz.${target}
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/run_fuzz.sh ${GPURUN_FUZZ_BINARY_DIR}/${target}_fuzz
                   ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/corpus/${target}
                   ${CMAKE_CURRENT_BINARY_DIR}/fuzz-runs/${target} ${GPURUN_FUZZ_FLAGS_${target}})
  set_tests_properties(Fuzz.${target} PROPERTIES LABELS fuzz TIMEOUT 300
                       ENVIRONMENT "${GPURUN_FUZZ_ENV_${target}}")
endforeach()
