# ringtrain_arch_sources(<list variable>): keeps <name>.${RINGTRAIN_ARCH}.cpp and drops the other
# architecture's twin (<name>.x86_64.cpp or <name>.portable.cpp).
function(ringtrain_arch_sources var)
  set(list ${${var}})
  if(RINGTRAIN_ARCH STREQUAL "x86_64")
    list(FILTER list EXCLUDE REGEX "\\.portable\\.cpp$")
  else()
    list(FILTER list EXCLUDE REGEX "\\.x86_64\\.cpp$")
  endif()
  set(${var} ${list} PARENT_SCOPE)
endfunction()

# ringtrain_library(<name> [DIRS dir...] DEPS dep...)
# A shared library ringtrain_<name> from every .cpp under src/<name> (or DIRS).
# Shared, so that the CUDA module loaded at run time (cuda/) binds to the same
# single copy of the registries and singletons as the program that loads it.
function(ringtrain_library name)
  cmake_parse_arguments(ARG "" "" "DIRS;DEPS" ${ARGN})
  if(NOT ARG_DIRS)
    set(ARG_DIRS src/${name})
  endif()
  set(sources)
  foreach(dir ${ARG_DIRS})
    file(GLOB_RECURSE found CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/${dir}/*.cpp)
    list(APPEND sources ${found})
  endforeach()
  ringtrain_arch_sources(sources)
  if(sources)
    add_library(ringtrain_${name} SHARED ${sources})
    target_include_directories(ringtrain_${name} PUBLIC $<BUILD_INTERFACE:${CMAKE_SOURCE_DIR}/include>
                                                        $<INSTALL_INTERFACE:include>)
    target_link_libraries(ringtrain_${name} PUBLIC ${ARG_DEPS})
  else()
    add_library(ringtrain_${name} INTERFACE)
    target_include_directories(ringtrain_${name} INTERFACE $<BUILD_INTERFACE:${CMAKE_SOURCE_DIR}/include>
                                                           $<INSTALL_INTERFACE:include>)
    target_link_libraries(ringtrain_${name} INTERFACE ${ARG_DEPS})
  endif()
  set_property(GLOBAL APPEND PROPERTY RINGTRAIN_INSTALL_TARGETS ringtrain_${name})
endfunction()
