# The libraries ringtrain's own libraries link, all from Debian (make deps-run).
# Shared by the build (RingtrainDeps.cmake) and the installed package
# (ringtrainConfig.cmake), so a program built against an installed ringtrain
# finds the same ones. RT_MPI_COMPONENTS: C CXX here, CXX for users.
if(NOT RT_MPI_COMPONENTS)
  set(RT_MPI_COMPONENTS C CXX)
endif()
find_package(Threads REQUIRED)
find_package(MPI REQUIRED COMPONENTS ${RT_MPI_COMPONENTS})
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(ZLIB REQUIRED)
# The user's own data (prepare --dataset npz | images): .npz zips, PNG and JPEG.
# libzip through pkg-config: Debian's libzip-config.cmake demands its command-line tools.
find_package(PkgConfig REQUIRED)
pkg_check_modules(LIBZIP REQUIRED IMPORTED_TARGET GLOBAL libzip)
# The subword tokenizer (prepare --dataset text --tokenizer sentencepiece): libsentencepiece-dev.
pkg_check_modules(SENTENCEPIECE REQUIRED IMPORTED_TARGET GLOBAL sentencepiece)
find_package(PNG REQUIRED)
find_package(JPEG REQUIRED)

# Parallel HDF5 (libhdf5-openmpi-dev) so that MPI-IO collective reads are available.
# FindHDF5 compiles a C test program, so a project that uses the package with C++ only
# (project(app CXX)) gets C enabled here: C and C++ come together with Debian's g++.
if(NOT CMAKE_C_COMPILER_LOADED)
  enable_language(C)
endif()
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
if(NOT TARGET DNNL::dnnl)
  add_library(DNNL::dnnl INTERFACE IMPORTED)
  target_link_libraries(DNNL::dnnl INTERFACE ${DNNL_LIBRARY})
  target_include_directories(DNNL::dnnl SYSTEM INTERFACE ${DNNL_INCLUDE_DIR})
endif()
set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)
find_path(CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas openblas-pthread)
include_directories(SYSTEM ${CBLAS_INCLUDE_DIR})
find_package(nlohmann_json 3 REQUIRED)
find_package(tomlplusplus 3 REQUIRED)
