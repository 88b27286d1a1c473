# Third-party libraries, all from Debian (installed by `make deps`).
find_package(Threads REQUIRED)
find_package(MPI REQUIRED COMPONENTS C CXX)
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(ZLIB REQUIRED)

# Parallel HDF5 (libhdf5-openmpi-dev) so that MPI-IO collective reads are available.
set(HDF5_PREFER_PARALLEL ON)
find_package(HDF5 REQUIRED COMPONENTS C)
if(NOT HDF5_IS_PARALLEL)
  message(WARNING "HDF5 is not parallel: MPI-IO collective reads are disabled")
endif()
if(NOT TARGET hdf5::hdf5)
  add_library(hdf5::hdf5 INTERFACE IMPORTED)
  target_include_directories(hdf5::hdf5 INTERFACE ${HDF5_INCLUDE_DIRS})
  target_link_libraries(hdf5::hdf5 INTERFACE ${HDF5_C_LIBRARIES})
  target_compile_definitions(hdf5::hdf5 INTERFACE ${HDF5_DEFINITIONS})
endif()

# oneDNN: Debian's dnnl-config.cmake insists on OpenCL (its GPU runtime), which
# we do not use, so the library is found directly.
find_library(DNNL_LIBRARY dnnl REQUIRED)
find_path(DNNL_INCLUDE_DIR dnnl.hpp REQUIRED)
add_library(DNNL::dnnl INTERFACE IMPORTED)
target_link_libraries(DNNL::dnnl INTERFACE ${DNNL_LIBRARY})
target_include_directories(DNNL::dnnl SYSTEM INTERFACE ${DNNL_INCLUDE_DIR})
set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)
find_path(CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas openblas-pthread)
include_directories(SYSTEM ${CBLAS_INCLUDE_DIR})

find_package(nlohmann_json 3 REQUIRED)
find_package(CLI11 REQUIRED)
find_package(tomlplusplus 3 REQUIRED)
find_package(GTest REQUIRED)
find_package(benchmark REQUIRED)
