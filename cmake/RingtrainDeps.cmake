# Third-party libraries, all from Debian: the library's own (RingtrainFindDeps,
# make deps-run), the command line's CLI11, and the tests' (make deps).
include(RingtrainFindDeps)
find_package(CLI11 REQUIRED)
# Tests and benchmarks only: `make run` installs neither (`make test` does).
if(RINGTRAIN_TESTS)
  find_package(GTest)
  if(NOT GTest_FOUND)
    message(STATUS "GoogleTest not found: tests are not configured (make test installs it)")
    set(RINGTRAIN_TESTS OFF)
  endif()
endif()
if(RINGTRAIN_BENCH)
  find_package(benchmark)
  if(NOT benchmark_FOUND OR NOT GTest_FOUND)
    message(STATUS "Google Benchmark or GoogleTest not found: benchmarks are not configured (make test installs them)")
    set(RINGTRAIN_BENCH OFF)
  endif()
endif()
