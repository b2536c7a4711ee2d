# fastpar_cxx_runtime_linkage(<out>): sets <out> to "static" when the C++ compiler links its
# C++ runtime (libstdc++ or libc++, with libsupc++/libc++abi) into every shared library it
# makes, "shared" when a shared library uses the runtime's own .so, "unknown" when the probe
# could not tell. The probe builds a small shared library that throws and looks at what it
# defines: a copy of the runtime defines __cxa_throw and the personality routine, a library
# using the shared runtime only refers to them. Without nm, its DT_NEEDED entries decide.
# The answer is cached for the same compiler and flags.
function(fastpar_cxx_runtime_linkage out)
  set(_key "${CMAKE_CXX_COMPILER}|${CMAKE_CXX_FLAGS}|${CMAKE_SHARED_LINKER_FLAGS}|${CMAKE_TOOLCHAIN_FILE}")
  if(DEFINED CACHE{FASTPAR_CXX_RUNTIME_PROBED} AND "$CACHE{FASTPAR_CXX_RUNTIME_PROBED_KEY}" STREQUAL "${_key}")
    set(${out} "$CACHE{FASTPAR_CXX_RUNTIME_PROBED}" PARENT_SCOPE)
    return()
  endif()
  fastpar_cxx_runtime_probe(_linkage)
  set(FASTPAR_CXX_RUNTIME_PROBED "${_linkage}" CACHE INTERNAL "")
  set(FASTPAR_CXX_RUNTIME_PROBED_KEY "${_key}" CACHE INTERNAL "")
  set(${out} "${_linkage}" PARENT_SCOPE)
endfunction()

function(fastpar_cxx_runtime_probe out)
  set(_dir "${CMAKE_CURRENT_BINARY_DIR}/fastpar_cxx_runtime_probe")
  file(WRITE "${_dir}/src/CMakeLists.txt"
    "cmake_minimum_required(VERSION 3.21)\n"
    "project(fastpar_cxx_runtime_probe CXX)\n"
    "add_library(probe SHARED probe.cpp)\n")
  file(WRITE "${_dir}/src/probe.cpp"
    "#include <stdexcept>\n#include <string>\n"
    "std::string fastpar_probe(const char * s) {\n"
    "    if (!s) throw std::runtime_error(\"probe\");\n"
    "    return std::string(s) + s;\n}\n")
  set(_flags
    "-DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}"
    "-DCMAKE_CXX_FLAGS=${CMAKE_CXX_FLAGS}"
    "-DCMAKE_SHARED_LINKER_FLAGS=${CMAKE_SHARED_LINKER_FLAGS}")
  if(CMAKE_TOOLCHAIN_FILE)
    list(APPEND _flags "-DCMAKE_TOOLCHAIN_FILE=${CMAKE_TOOLCHAIN_FILE}")
  endif()
  file(REMOVE_RECURSE "${_dir}/build")
  try_compile(_built "${_dir}/build" "${_dir}/src" fastpar_cxx_runtime_probe probe
    CMAKE_FLAGS ${_flags}
    OUTPUT_VARIABLE _log)
  file(GLOB_RECURSE _lib "${_dir}/build/*probe${CMAKE_SHARED_LIBRARY_SUFFIX}")
  if(NOT _built OR NOT _lib)
    set(${out} "unknown" PARENT_SCOPE)
    return()
  endif()
  list(GET _lib 0 _lib)
  if(CMAKE_NM)
    execute_process(COMMAND "${CMAKE_NM}" -D --defined-only "${_lib}"
      OUTPUT_VARIABLE _symbols RESULT_VARIABLE _rc ERROR_QUIET)
    if(_rc EQUAL 0)
      string(REPLACE "\n" ";" _symbols "${_symbols}")
      list(FILTER _symbols INCLUDE REGEX " (__cxa_throw|__gxx_personality_v0)$")
      if(_symbols)
        set(${out} "static" PARENT_SCOPE)
      else()
        set(${out} "shared" PARENT_SCOPE)
      endif()
      return()
    endif()
  endif()
  file(STRINGS "${_lib}" _needed REGEX "^lib(stdc|c)\\+\\+\\.so")
  if(_needed)
    set(${out} "shared" PARENT_SCOPE)
  else()
    set(${out} "static" PARENT_SCOPE)
  endif()
endfunction()
