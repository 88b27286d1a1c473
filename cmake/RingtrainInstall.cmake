# `make install PREFIX=DIR` (cmake --install). The tree has no path into the
# build tree, so it can be moved: the package config finds itself relative to
# its own location, and binaries keep only $ORIGIN-relative RUNPATHs to the
# ringtrain libraries plus those outside the build tree (the CUDA toolkit's
# lib64 for the CUDA module).
include(CMakePackageConfigHelpers)

get_property(rt_targets GLOBAL PROPERTY RINGTRAIN_INSTALL_TARGETS)
set_target_properties(${rt_targets} PROPERTIES INSTALL_RPATH "$ORIGIN" INSTALL_RPATH_USE_LINK_PATH ON)
set_target_properties(ringtrain PROPERTIES INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}"
                                           INSTALL_RPATH_USE_LINK_PATH ON)
set_target_properties(ringtrain_all PROPERTIES EXPORT_NAME ringtrain)
install(TARGETS ${rt_targets} ringtrain_all EXPORT ringtrainTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS ringtrain RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/ringtrain DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.hpp")
if(RINGTRAIN_HAVE_CUDA)
  install(DIRECTORY cuda/ringtrain/cuda DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ringtrain
          FILES_MATCHING PATTERN "*.hpp")
endif()

set(RT_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/ringtrain)
install(EXPORT ringtrainTargets NAMESPACE ringtrain:: DESTINATION ${RT_CMAKE_DIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/ringtrainConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/ringtrainConfig.cmake INSTALL_DESTINATION ${RT_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/ringtrainConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_BINARY_DIR}/ringtrainConfig.cmake ${CMAKE_BINARY_DIR}/ringtrainConfigVersion.cmake
              ${CMAKE_CURRENT_LIST_DIR}/RingtrainFindDeps.cmake
        DESTINATION ${RT_CMAKE_DIR})

# pkg-config: the libraries in link order (a RUNPATH to them, as the CMake
# package gives), then what they need. Not the CUDA module: it is loaded at run time.
set(RT_PC_LIBS "-Wl,-rpath,\${libdir}")
foreach(l cli train parallel data optim engine nn comm core)
  if(TARGET ringtrain_${l})
    get_target_property(type ringtrain_${l} TYPE)
    if(NOT type STREQUAL "INTERFACE_LIBRARY")
      string(APPEND RT_PC_LIBS " -lringtrain_${l}")
    endif()
  endif()
endforeach()
set(RT_PC_PRIVATE "")
foreach(lib ${DNNL_LIBRARY} ${BLAS_LIBRARIES} ${HDF5_C_LIBRARIES})
  string(APPEND RT_PC_PRIVATE " ${lib}")
endforeach()
# The prefix relative to the .pc file, so that a moved tree still works.
file(RELATIVE_PATH RT_PC_UP /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
configure_file(${CMAKE_CURRENT_LIST_DIR}/ringtrain.pc.in ${CMAKE_BINARY_DIR}/ringtrain.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/ringtrain.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# `make uninstall`: removes what the last install wrote (install_manifest.txt).
add_custom_target(uninstall
  COMMAND ${CMAKE_COMMAND} -DMANIFEST=${CMAKE_BINARY_DIR}/install_manifest.txt
          -P ${CMAKE_CURRENT_LIST_DIR}/RingtrainUninstall.cmake)
