#pragma once
// Whether the MPI library accepts device pointers in this run
// (MPIX_Query_cuda_support at run time; false when the MPI has no CUDA
// extension). RINGTRAIN_CUDA_AWARE=0/1 in the environment overrides it, so the
// host-staged path can be tested on a CUDA-aware MPI and vice versa.
namespace ringtrain::cuda {

bool mpi_cuda_aware();           // what MPI reports
bool use_device_pointers_in_mpi();  // mpi_cuda_aware() unless overridden by the environment

}  // namespace ringtrain::cuda
