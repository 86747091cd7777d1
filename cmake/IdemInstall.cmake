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
  # idem::testing_async (header-only) comes with the coroutine face it tests.
  if(component STREQUAL "async" AND TARGET idem_testing_async)
    install(TARGETS idem_testing_async EXPORT idem-async-targets)
  endif()
  install(EXPORT idem-${component}-targets NAMESPACE idem:: DESTINATION ${IDEM_CMAKE_DIR})
endforeach()
install(TARGETS idem_testing EXPORT idem-testing-targets)
install(EXPORT idem-testing-targets NAMESPACE idem:: DESTINATION ${IDEM_CMAKE_DIR})

install(DIRECTORY core/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY testing/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET idem_testing_async)
  install(DIRECTORY testing/async/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endif()
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
# Every component idem has, built here or not, so idemConfig.cmake can tell a misspelt name
# ("no such component") from one this installation was built without.
set(IDEM_CONFIG_KNOWN core net testing open async)
foreach(spec IN LISTS IDEM_BACKEND_SPECS)
  string(REGEX MATCH "^[^,]+" part "${spec}")
  list(APPEND IDEM_CONFIG_KNOWN ${part} ${part}_async)
endforeach()
foreach(spec IN LISTS IDEM_TRANSPORT_SPECS)
  string(REGEX MATCH "^[^,]+" part "${spec}")
  list(APPEND IDEM_CONFIG_KNOWN ${part})
endforeach()
configure_package_config_file(cmake/idemConfig.cmake.in
  ${PROJECT_BINARY_DIR}/idemConfig.cmake INSTALL_DESTINATION ${IDEM_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/idemConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/idemConfig.cmake ${PROJECT_BINARY_DIR}/idemConfigVersion.cmake
  ${PROJECT_SOURCE_DIR}/cmake/FindHiredis.cmake ${PROJECT_SOURCE_DIR}/cmake/FindAsio.cmake
  DESTINATION ${IDEM_CMAKE_DIR})

# ---- pkg-config ------------------------------------------------------------------------------
# One idem-<component>.pc per installed component, for builds that do not use CMake:
#   pkg-config --cflags --libs idem-sqlite
# Each names the component's library and, through Requires, the idem components and client
# libraries it links, read from the target itself (LINK_LIBRARIES and INTERFACE_LINK_LIBRARIES),
# so the files follow the CMake targets without a second list to keep. What a link needs depends
# on the library type: a static archive needs every library it uses on the program's link line,
# so all of them are Requires; a shared library carries its private ones as DT_NEEDED entries,
# so those are Requires.private (asked for by `pkg-config --static` only). The files locate the
# prefix from their own directory (${pcfiledir}), so `cmake --install --prefix` anywhere and a
# moved prefix both work.

# _idem_pc_dependency(<link item> <out requires> <out libs>): the pkg-config module (or linker
# flag) standing for one item a component links. A backend or transport whose client library has
# no entry here stops the configure step: add its pkg-config module name (docs/backends.md).
function(_idem_pc_dependency item out_requires out_libs)
  set(requires "")
  set(libs "")
  if(item MATCHES "^idem(::|_)(.+)$")
    set(requires "idem-${CMAKE_MATCH_2}")
  elseif(item STREQUAL "Threads::Threads")
    set(libs "-pthread")
  elseif(item STREQUAL "nlohmann_json::nlohmann_json")
    set(requires nlohmann_json)
  elseif(item STREQUAL "OpenSSL::Crypto")
    set(requires libcrypto)
  elseif(item STREQUAL "OpenSSL::SSL")
    set(requires libssl)
  elseif(item STREQUAL "SQLite::SQLite3")
    set(requires sqlite3)
  elseif(item STREQUAL "Hiredis::Hiredis")
    set(requires hiredis)
  elseif(item STREQUAL "PostgreSQL::PostgreSQL")
    set(requires libpq)
  elseif(item MATCHES "^rabbitmq::rabbitmq(-static)?$")
    set(requires librabbitmq)
  elseif(item STREQUAL "Asio::Asio")
    set(libs "-pthread")  # header-only and on the default include path; Debian ships no asio.pc
  else()
    message(FATAL_ERROR "idem: no pkg-config module is known for '${item}', which an idem "
                        "library links: add it to _idem_pc_dependency in cmake/IdemInstall.cmake")
  endif()
  set(${out_requires} ${requires} PARENT_SCOPE)
  set(${out_libs} ${libs} PARENT_SCOPE)
endfunction()

set(IDEM_PC_DIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(IS_ABSOLUTE "${IDEM_PC_DIR}")
  set(idem_pc_prefix "${CMAKE_INSTALL_PREFIX}")
else()
  # ${pcfiledir} is <prefix>/<libdir>/pkgconfig: one ".." per component of that path.
  string(REGEX REPLACE "[^/]+" ".." idem_pc_up "${IDEM_PC_DIR}")
  set(idem_pc_prefix "\${pcfiledir}/${idem_pc_up}")
endif()
foreach(dir LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${dir}}")
    set(idem_pc_${dir} "${CMAKE_INSTALL_${dir}}")
  else()
    set(idem_pc_${dir} "\${prefix}/${CMAKE_INSTALL_${dir}}")
  endif()
endforeach()

set(idem_pc_description_core "Idempotent consumers and operations: the core library")
set(idem_pc_description_net "The byte streams (TCP, unix sockets, TLS) idem's backends share")
set(idem_pc_description_async "idem's coroutine face on standalone Asio")
set(idem_pc_description_open "idem's recorders and stores opened by URL, over every backend built")
set(idem_pc_description_testing "idem's manual clock, crash points and conformance suites")
set(idem_pc_description_rabbitmq "idem's RabbitMQ transport")
set(idem_pc_title_sqlite SQLite)
set(idem_pc_title_redis Redis)
set(idem_pc_title_postgres PostgreSQL)

foreach(component IN LISTS IDEM_COMPONENTS ITEMS testing)
  set(target idem_${component})
  get_target_property(type ${target} TYPE)
  get_target_property(interface ${target} INTERFACE_LINK_LIBRARIES)
  set(all "")
  if(NOT type STREQUAL "INTERFACE_LIBRARY")
    get_target_property(all ${target} LINK_LIBRARIES)
  endif()
  if(NOT interface)
    set(interface "")
  endif()
  if(NOT all)
    set(all "")
  endif()
  # Public: what the headers need too. A static archive lists its private items as
  # $<LINK_ONLY:...> in INTERFACE_LINK_LIBRARIES: those are not public.
  set(public "")
  foreach(item IN LISTS interface)
    if(NOT item MATCHES "^\\$<LINK_ONLY:")
      list(APPEND public ${item})
    endif()
  endforeach()
  set(requires "")
  set(requires_private "")
  set(libs "")
  set(libs_private "")
  foreach(item IN LISTS all public)
    _idem_pc_dependency(${item} module flag)
    if(item IN_LIST public OR type STREQUAL "STATIC_LIBRARY")
      list(APPEND requires ${module})
      list(APPEND libs ${flag})
    else()
      list(APPEND requires_private ${module})
      list(APPEND libs_private ${flag})
    endif()
  endforeach()
  foreach(var requires requires_private libs libs_private)
    list(REMOVE_DUPLICATES ${var})
    list(JOIN ${var} " " ${var})
  endforeach()
  string(REGEX REPLACE "_async$" "" backend ${component})
  set(title ${backend})
  if(DEFINED idem_pc_title_${backend})
    set(title ${idem_pc_title_${backend}})
  endif()
  if(DEFINED idem_pc_description_${component})
    set(description "${idem_pc_description_${component}}")
  elseif(component MATCHES "_async$")
    set(description "idem's ${title} backend, coroutine face")
  else()
    set(description "idem's ${title} backend (recorder and store)")
  endif()
  set(own_libs "")
  if(NOT type STREQUAL "INTERFACE_LIBRARY")
    get_target_property(output ${target} OUTPUT_NAME)
    set(own_libs "-L\${libdir} -l${output}")
  endif()
  file(CONFIGURE OUTPUT ${PROJECT_BINARY_DIR}/pkgconfig/idem-${component}.pc CONTENT [=[
prefix=@idem_pc_prefix@
libdir=@idem_pc_LIBDIR@
includedir=@idem_pc_INCLUDEDIR@

Name: idem-@component@
Description: @description@
Version: @PROJECT_VERSION@
Requires: @requires@
Requires.private: @requires_private@
Libs: @own_libs@ @libs@
Libs.private: @libs_private@
Cflags: -I${includedir}
]=] @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/pkgconfig/idem-${component}.pc DESTINATION ${IDEM_PC_DIR})
endforeach()
