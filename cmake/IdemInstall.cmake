# install(EXPORT) per component, so find_package(idem COMPONENTS sqlite) loads just what is asked.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(IDEM_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/idem)
get_property(IDEM_COMPONENTS GLOBAL PROPERTY IDEM_COMPONENTS)

foreach(component IN LISTS IDEM_COMPONENTS)
  install(TARGETS idem_${component} EXPORT idem-${component}-targets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
    RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  install(EXPORT idem-${component}-targets NAMESPACE idem:: DESTINATION ${IDEM_CMAKE_DIR})
endforeach()
install(TARGETS idem_testing EXPORT idem-testing-targets)
install(EXPORT idem-testing-targets NAMESPACE idem:: DESTINATION ${IDEM_CMAKE_DIR})

install(DIRECTORY core/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY testing/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
foreach(component IN LISTS IDEM_COMPONENTS)
  foreach(parent backends transports)
    if(NOT component STREQUAL "core" AND EXISTS ${PROJECT_SOURCE_DIR}/${parent}/${component}/include)
      install(DIRECTORY ${parent}/${component}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
    endif()
  endforeach()
  if(EXISTS ${PROJECT_SOURCE_DIR}/${component}/include AND NOT component STREQUAL "core")
    install(DIRECTORY ${component}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  endif()
endforeach()

# Whether the installed libraries are shared (BUILD_SHARED_LIBS, or a parent project's choice):
# idemConfig.cmake asks for the client libraries' packages only for static archives.
get_target_property(IDEM_CONFIG_LIBRARY_TYPE idem_core TYPE)
if(IDEM_CONFIG_LIBRARY_TYPE STREQUAL "SHARED_LIBRARY")
  set(IDEM_CONFIG_SHARED ON)
else()
  set(IDEM_CONFIG_SHARED OFF)
endif()
configure_package_config_file(cmake/idemConfig.cmake.in
  ${PROJECT_BINARY_DIR}/idemConfig.cmake INSTALL_DESTINATION ${IDEM_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/idemConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/idemConfig.cmake ${PROJECT_BINARY_DIR}/idemConfigVersion.cmake
  ${PROJECT_SOURCE_DIR}/cmake/FindHiredis.cmake ${PROJECT_SOURCE_DIR}/cmake/FindAsio.cmake
  DESTINATION ${IDEM_CMAKE_DIR})
