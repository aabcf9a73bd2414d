# libtorch from the pinned `torch` wheel in the project's virtual environment.
# We do not use the wheel's TorchConfig.cmake: it insists on a CUDA toolkit + cuDNN layout at
# configure time. Grove only needs headers and the shared libraries, so it imports them directly.
execute_process(
  COMMAND "${GROVE_PYTHON}" -c "import os, torch; print(os.path.dirname(torch.__file__)); print(int(torch.compiled_with_cxx11_abi())); print(torch.__version__)"
  OUTPUT_VARIABLE _grove_torch_out RESULT_VARIABLE _grove_torch_rc ERROR_VARIABLE _grove_torch_err
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _grove_torch_rc EQUAL 0)
  message(FATAL_ERROR "Grove needs the torch wheel in ${GROVE_PYTHON}: run `make deps` first.\n${_grove_torch_err}")
endif()
string(REPLACE "\n" ";" _grove_torch_out "${_grove_torch_out}")
list(GET _grove_torch_out 0 GROVE_TORCH_DIR)
list(GET _grove_torch_out 1 GROVE_TORCH_CXX11_ABI)
list(GET _grove_torch_out 2 GROVE_TORCH_VERSION)
message(STATUS "libtorch ${GROVE_TORCH_VERSION} from ${GROVE_TORCH_DIR}")

set(_grove_torch_libs torch torch_cpu c10)
if(EXISTS "${GROVE_TORCH_DIR}/lib/libtorch_cuda.so")
  list(APPEND _grove_torch_libs torch_cuda c10_cuda)
  set(GROVE_TORCH_HAS_CUDA ON)
endif()
set(_grove_torch_paths "")
foreach(lib IN LISTS _grove_torch_libs)
  list(APPEND _grove_torch_paths "${GROVE_TORCH_DIR}/lib/lib${lib}.so")
endforeach()

# The wheel's own OpenMP runtime: code of ours that opens OpenMP regions must run on it (one
# libgomp.so.1 per process, torch's, so its threads are shared, never oversubscribed)
set(GROVE_TORCH_OPENMP "")
if(EXISTS "${GROVE_TORCH_DIR}/lib/libgomp.so.1")
  set(GROVE_TORCH_OPENMP "${GROVE_TORCH_DIR}/lib/libgomp.so.1")
endif()

add_library(grove_torch_deps INTERFACE)
target_include_directories(grove_torch_deps SYSTEM INTERFACE
  "${GROVE_TORCH_DIR}/include" "${GROVE_TORCH_DIR}/include/torch/csrc/api/include")
target_compile_definitions(grove_torch_deps INTERFACE _GLIBCXX_USE_CXX11_ABI=${GROVE_TORCH_CXX11_ABI})
# --no-as-needed: nothing references libtorch_cuda directly, and without this flag the linker drops
# it, CUDA kernels are never registered and torch silently reports no GPU.
target_link_options(grove_torch_deps INTERFACE "LINKER:--no-as-needed")
# libstdc++ first: libtorch.so exports its own (incompatible) copy of std::filesystem, and whichever
# library comes first in the NEEDED list wins symbol lookup (std::filesystem::remove_all crashed).
target_link_libraries(grove_torch_deps INTERFACE stdc++ ${_grove_torch_paths})

# libtorch stays in the virtual environment's wheel: installed Grove libraries find it there
list(APPEND CMAKE_INSTALL_RPATH "${GROVE_TORCH_DIR}/lib")
