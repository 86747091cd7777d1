# FindHiredis — Debian's libhiredis-dev ships a pkg-config file but no CMake target.
# Provides Hiredis::Hiredis and Hiredis_FOUND / Hiredis_VERSION.
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(PC_HIREDIS QUIET hiredis)
endif()
find_path(Hiredis_INCLUDE_DIR NAMES hiredis/hiredis.h HINTS ${PC_HIREDIS_INCLUDEDIR}/..
          ${PC_HIREDIS_INCLUDE_DIRS})
find_library(Hiredis_LIBRARY NAMES hiredis HINTS ${PC_HIREDIS_LIBDIR} ${PC_HIREDIS_LIBRARY_DIRS})
set(Hiredis_VERSION ${PC_HIREDIS_VERSION})
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Hiredis REQUIRED_VARS Hiredis_LIBRARY Hiredis_INCLUDE_DIR
                                  VERSION_VAR Hiredis_VERSION)
if(Hiredis_FOUND AND NOT TARGET Hiredis::Hiredis)
  add_library(Hiredis::Hiredis UNKNOWN IMPORTED)
  set_target_properties(Hiredis::Hiredis PROPERTIES IMPORTED_LOCATION ${Hiredis_LIBRARY}
                        INTERFACE_INCLUDE_DIRECTORIES ${Hiredis_INCLUDE_DIR})
endif()
mark_as_advanced(Hiredis_INCLUDE_DIR Hiredis_LIBRARY)
