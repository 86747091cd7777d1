# Helpers shared by idem's CMake files.

# Warnings for idem's own targets only (never forced on users' targets).
function(idem_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wconversion
                                           -Wno-sign-conversion -Wnon-virtual-dtor)
  if(IDEM_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
  # GCC 12 at -O3 reports impossible overlaps inside libstdc++'s own string concatenation
  # (GCC bug 105329, fixed in 13): a false positive that broke the release preset.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    target_compile_options(${target} PRIVATE -Wno-restrict)
  endif()
endfunction()

# idem_backend_enabled(<name> <find_package name> <out var>)
# Resolves IDEM_WITH_<NAME> (AUTO|ON|OFF): AUTO builds the backend when its client library is
# found, ON requires it, OFF skips it.
function(idem_backend_enabled name package out)
  string(TOUPPER ${name} upper)
  set(mode "${IDEM_WITH_${upper}}")
  if(mode STREQUAL "")
    set(mode AUTO)
  endif()
  string(TOUPPER "${mode}" mode)
  if(mode STREQUAL "OFF")
    set(${out} OFF PARENT_SCOPE)
    return()
  endif()
  if(mode STREQUAL "ON")
    find_package(${package} REQUIRED)
  else()
    find_package(${package} QUIET)
  endif()
  if(${package}_FOUND)
    set(${out} ON PARENT_SCOPE)
  else()
    message(STATUS "idem: ${name} backend skipped (${package} not found)")
    set(${out} OFF PARENT_SCOPE)
  endif()
endfunction()

# idem_library(<name> SOURCES ... DEPS ...) — an idem component: target idem_<name>, alias
# idem::<name>, public headers in include/, exported as component <name>.
function(idem_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;PUBLIC_DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(idem_${name} ${ARG_SOURCES})
  add_library(idem::${name} ALIAS idem_${name})
  # VERSION/SOVERSION name a shared library's file and SONAME (libidem_core.so.0.1 while idem is
  # 0.x, see IDEM_SOVERSION); no export macro: every symbol keeps default visibility, so
  # DEFINE_SYMBOL is off and a shared build compiles the same objects as a static one.
  set_target_properties(idem_${name} PROPERTIES OUTPUT_NAME idem_${name} EXPORT_NAME ${name}
                                                POSITION_INDEPENDENT_CODE ON
                                                VERSION ${PROJECT_VERSION}
                                                SOVERSION ${IDEM_SOVERSION}
                                                DEFINE_SYMBOL "")
  get_target_property(type idem_${name} TYPE)
  if(type STREQUAL "SHARED_LIBRARY")
    # Installed side by side in one directory, idem's libraries find each other through $ORIGIN
    # (libidem_open.so needs libidem_sqlite.so.0.1 ...), wherever the prefix is moved; a packager
    # installing into the system's library directory passes -DCMAKE_SKIP_INSTALL_RPATH=ON (or
    # sets CMAKE_INSTALL_RPATH, which then replaces this).
    if(NOT DEFINED CMAKE_INSTALL_RPATH)
      set_target_properties(idem_${name} PROPERTIES INSTALL_RPATH "$ORIGIN")
    endif()
    # Every library links what it uses: an undefined symbol is a link error here, not in the
    # program that loads it. (Clang does not link the sanitizer runtimes into shared libraries,
    # whose symbols would then be undefined.)
    if(CMAKE_SYSTEM_NAME STREQUAL "Linux"
       AND (NOT IDEM_SANITIZE OR CMAKE_CXX_COMPILER_ID STREQUAL "GNU"))
      target_link_options(idem_${name} PRIVATE LINKER:--no-undefined)
    endif()
    # The dynamic symbol table holds what a program or another idem library can reference
    # (DESIGN-NOTES, "The public face"). Inline functions and template instantiations are compiled
    # into every object that uses them, so none needs exporting: -fvisibility-inlines-hidden
    # (static locals of inline functions, typeinfo and vtables keep default visibility, so a
    # `catch` or a dynamic_cast across libraries is unchanged). The internal names listed next to
    # the library's CMakeLists.txt are kept out too (idem_local_symbols).
    set_target_properties(idem_${name} PROPERTIES VISIBILITY_INLINES_HIDDEN ON)
    idem_local_symbols(${name})
  endif()
  # The public face in tiers (DESIGN-NOTES, "The public face"): include/ is installed;
  # internal/ holds headers idem's own components share (idem::net, idem/detail/ helpers no
  # installed header needs), seen by targets built beside idem and never installed.
  if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/include)
    target_include_directories(idem_${name} PUBLIC
      $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>)
  endif()
  if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/internal)
    target_include_directories(idem_${name} PUBLIC
      $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/internal>)
  endif()
  target_include_directories(idem_${name} PUBLIC $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_compile_features(idem_${name} PUBLIC cxx_std_20)
  target_link_libraries(idem_${name} PUBLIC ${ARG_PUBLIC_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  idem_warnings(idem_${name})
  set_property(GLOBAL APPEND PROPERTY IDEM_COMPONENTS ${name})
endfunction()

# idem_local_symbols(<name>) — keeps the names listed in <name>.local-symbols (beside the
# CMakeLists.txt that calls idem_library(<name>)) out of shared libidem_<name>.so's dynamic symbol
# table, with a linker version script written from the list (GNU ld, gold and lld read it). One
# qualified `detail` name a line, `#` comments:
#   idem::x::detail::Name    its symbols (members, overloads, template instantiations) and every
#                            symbol whose name mentions it (std/Asio templates instantiated on it)
#   ^idem::x::detail::Name   its own symbols only: a symbol of another name that takes it as an
#                            argument stays exported (another library calls that one)
# A static build ignores the list. Listing a name another idem library uses makes that library's
# link fail (it links with --no-undefined), never a program at run time.
function(idem_local_symbols name)
  set(list ${CMAKE_CURRENT_SOURCE_DIR}/${name}.local-symbols)
  if(NOT EXISTS ${list} OR NOT CMAKE_SYSTEM_NAME STREQUAL "Linux")
    return()
  endif()
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${list})
  file(STRINGS ${list} lines)
  set(patterns "")
  foreach(line IN LISTS lines)
    string(STRIP "${line}" line)
    if(line STREQUAL "" OR line MATCHES "^#")
      continue()
    endif()
    if(NOT line MATCHES "^(\\^?)(idem::([a-z0-9_]+::)*detail::[A-Za-z0-9_:]*[A-Za-z0-9_])$")
      message(FATAL_ERROR "${list}: \"${line}\" is not a name in an idem detail namespace")
    endif()
    set(anchor "${CMAKE_MATCH_1}")
    set(entity "${CMAKE_MATCH_2}")
    # The name itself (a variable) as a one-character class: a pattern without a wildcard is an
    # exact name, which lld (--no-undefined-version) rejects when this build does not define it.
    string(REGEX REPLACE "(.)$" "[\\1]" exact "${entity}")
    string(APPEND patterns "      ${exact};\n")
    if(anchor)
      string(APPEND patterns "      ${entity}[^a-zA-Z0-9_]*;\n")
    else()
      string(APPEND patterns "      *${entity}[^a-zA-Z0-9_]*;\n")
    endif()
  endforeach()
  set(map ${CMAKE_CURRENT_BINARY_DIR}/idem_${name}.map)
  file(RELATIVE_PATH source ${PROJECT_SOURCE_DIR} ${list})
  set(comment "/* Generated from ${source} by idem_local_symbols (cmake/IdemHelpers.cmake). */")
  file(CONFIGURE OUTPUT ${map} @ONLY
       CONTENT "${comment}\n{\n  local:\n    extern \"C++\" {\n@patterns@    };\n};\n")
  target_link_options(idem_${name} PRIVATE "LINKER:--version-script=${map}")
  set_property(TARGET idem_${name} APPEND PROPERTY LINK_DEPENDS ${map})
endfunction()

# idem_program_libs(<name> <out libs> <out ok>) — what a test, example, benchmark or fuzzer
# named <name> needs, read from its name, in one place:
#   <part>_...            a backend or transport (IDEM_KNOWN_PARTS): idem::<part> and its client
#   ...async...           (the word "async" in the name) idem::async, and with a backend part
#                         that backend's idem::<part>_async (a transport has no async twin: a
#                         rabbitmq_..._async_... program hands off to the coroutine face itself)
#   open_...              idem::open
#   http_...              idem::http (HTTP idempotency, on the coroutine face)
# <out ok> is FALSE when something it needs was not built: the caller skips the program.
function(idem_program_libs name out_libs out_ok)
  set(libs "")
  set(ok TRUE)
  set(part "")
  if(name MATCHES "^([a-z0-9]+)_")
    set(part ${CMAKE_MATCH_1})
    if(NOT part IN_LIST IDEM_KNOWN_PARTS)
      set(part "")
    endif()
  endif()
  if(part)
    if(part IN_LIST IDEM_PARTS)
      string(TOUPPER ${part} upper)
      list(APPEND libs idem::${part} ${IDEM_CLIENT_${upper}})
    else()
      set(ok FALSE)
    endif()
  endif()
  if(name MATCHES "(^|_)async(_|$)")
    if(TARGET idem::async)
      list(APPEND libs idem::async)
      if(part AND TARGET idem::${part}_async)
        list(APPEND libs idem::${part}_async)
      elseif(part AND NOT part IN_LIST IDEM_TRANSPORTS)
        set(ok FALSE)
      endif()
    else()
      set(ok FALSE)
    endif()
  endif()
  foreach(component IN ITEMS http open)
    if(name MATCHES "^${component}_")
      if(TARGET idem::${component})
        list(APPEND libs idem::${component})
      else()
        set(ok FALSE)
      endif()
    endif()
  endforeach()
  set(${out_libs} ${libs} PARENT_SCOPE)
  set(${out_ok} ${ok} PARENT_SCOPE)
endfunction()

# idem_use_url(<target>) — compiles the private URL toolkit (url/idem_url.hpp, the OBJECT library
# idem_url) into <target>. Its objects become part of the target, and no link dependency is
# recorded: install(EXPORT) and the pkg-config files see nothing of it. Each library that parses
# URLs (idem::open, idem::redis, idem::rabbitmq) has its own hidden copy; a program linking
# several static ones takes the objects from the first archive that has them.
function(idem_use_url target)
  target_sources(${target} PRIVATE $<TARGET_OBJECTS:idem_url>)
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/url)
endfunction()
