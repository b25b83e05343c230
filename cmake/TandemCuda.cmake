# CUDA is optional: kernels/cuda builds when nvcc is found and TANDEM_CUDA is ON.
set(TANDEM_HAVE_CUDA OFF)
if(TANDEM_CUDA)
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  set(_tandem_nvcc_missing OFF)
  if(CMAKE_CUDA_COMPILER)
    # A compiler named explicitly but absent would make enable_language() abort the whole
    # configure; treat it like a missing nvcc instead, loudly.
    find_program(_tandem_nvcc NAMES "${CMAKE_CUDA_COMPILER}" NO_CACHE)
    if(NOT _tandem_nvcc)
      message(WARNING "CMAKE_CUDA_COMPILER=${CMAKE_CUDA_COMPILER} does not exist; "
                      "building without kernels/cuda")
      set(_tandem_nvcc_missing ON)
    endif()
  endif()
  if(NOT _tandem_nvcc_missing)
    check_language(CUDA)
  endif()
  if(CMAKE_CUDA_COMPILER AND NOT _tandem_nvcc_missing)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80-real 90a-real)
    endif()
    # One shared cudart per process: CMake's default for CUDA targets is the static runtime,
    # which would sit next to the CUDA::cudart that the libraries link explicitly.
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
    enable_language(CUDA)
    if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      # CMake 3.25 (Debian 12) does not know nvcc's C++20 flag, and CUDA sources inherit the
      # C++20 of CMAKE_CXX_STANDARD, so generation fails with 'requires the language dialect
      # "CUDA20"'. nvcc >= 12 accepts -std=c++20 (it has no gnu++20), so teach CMake the flag.
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    find_library(TANDEM_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR}
      /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu)
    find_path(TANDEM_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS}
      /usr/local/cuda/include /usr/include)
    if(NOT TANDEM_NCCL_LIBRARY OR NOT TANDEM_NCCL_INCLUDE)
      message(FATAL_ERROR "nvcc found but NCCL is missing; install NCCL or pass -DTANDEM_CUDA=OFF")
    endif()
    add_library(tandem::nccl UNKNOWN IMPORTED GLOBAL)
    set_target_properties(tandem::nccl PROPERTIES IMPORTED_LOCATION "${TANDEM_NCCL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${TANDEM_NCCL_INCLUDE}")
    set(TANDEM_HAVE_CUDA ON)
    message(STATUS "Tandem: CUDA ${CMAKE_CUDA_COMPILER_VERSION}, archs ${CMAKE_CUDA_ARCHITECTURES}")
  else()
    message(STATUS "Tandem: nvcc not found, building without kernels/cuda")
  endif()
endif()
