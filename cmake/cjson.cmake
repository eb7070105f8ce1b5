# cjson.cmake — the cJSON the library parses checkpoints' JSON with, as the target moex_cjson.
# Looked for in this order:
#   1. pkg-config's libcjson (when pkg-config is there);
#   2. an installed cJSON found without pkg-config: the header cjson/cJSON.h (find_path) and the
#      library cjson (find_library); CMAKE_PREFIX_PATH points at other prefixes;
#   3. compiled from MOEX_CJSON_SOURCE_DIR, a folder holding cJSON.c and cJSON.h (cJSON's own
#      sources), when no installed cJSON is found.
# Stops with a message naming the three ways when none gives a cJSON.
set(MOEX_CJSON_SOURCE_DIR "" CACHE PATH
    "A folder with cJSON.c and cJSON.h, compiled into moex when no installed cJSON is found")

add_library(moex_cjson INTERFACE)
set(_moex_cjson_from "")
# moex.pc's private dependencies on cJSON: none when its sources are compiled in (a build for
# running in its build tree; the shared library then carries cJSON, the static one does not)
set(MOEX_PC_REQUIRES_PRIVATE "")
set(MOEX_PC_LIBS_PRIVATE "")
if(PKG_CONFIG_FOUND)
  pkg_check_modules(CJSON QUIET IMPORTED_TARGET libcjson)
  if(CJSON_FOUND)
    target_link_libraries(moex_cjson INTERFACE PkgConfig::CJSON)
    set(_moex_cjson_from "pkg-config libcjson ${CJSON_VERSION}")
    set(MOEX_PC_REQUIRES_PRIVATE "libcjson") # what moex.pc names for a static link
  endif()
endif()
if(NOT _moex_cjson_from)
  find_path(MOEX_CJSON_INCLUDE_DIR cjson/cJSON.h)
  find_library(MOEX_CJSON_LIBRARY NAMES cjson)
  if(MOEX_CJSON_INCLUDE_DIR AND MOEX_CJSON_LIBRARY)
    target_include_directories(moex_cjson INTERFACE ${MOEX_CJSON_INCLUDE_DIR} ${MOEX_CJSON_INCLUDE_DIR}/cjson)
    target_link_libraries(moex_cjson INTERFACE ${MOEX_CJSON_LIBRARY})
    set(_moex_cjson_from "${MOEX_CJSON_LIBRARY}")
    set(MOEX_PC_LIBS_PRIVATE "-lcjson")
  endif()
endif()
if(NOT _moex_cjson_from AND MOEX_CJSON_SOURCE_DIR)
  foreach(f cJSON.c cJSON.h)
    if(NOT EXISTS ${MOEX_CJSON_SOURCE_DIR}/${f})
      message(FATAL_ERROR "moex: MOEX_CJSON_SOURCE_DIR=${MOEX_CJSON_SOURCE_DIR} has no ${f}")
    endif()
  endforeach()
  # the library includes <cjson/cJSON.h>: the header is copied under that name
  set(_moex_cjson_include ${CMAKE_CURRENT_BINARY_DIR}/cjson_source/include)
  configure_file(${MOEX_CJSON_SOURCE_DIR}/cJSON.h ${_moex_cjson_include}/cjson/cJSON.h COPYONLY)
  add_library(moex_cjson_source STATIC ${MOEX_CJSON_SOURCE_DIR}/cJSON.c)
  target_include_directories(moex_cjson_source PUBLIC ${_moex_cjson_include} ${_moex_cjson_include}/cjson)
  target_compile_options(moex_cjson_source PRIVATE -w) # another project's code: its warnings are not ours
  target_link_libraries(moex_cjson_source PUBLIC m)
  target_link_libraries(moex_cjson INTERFACE moex_cjson_source)
  set(_moex_cjson_from "compiled from ${MOEX_CJSON_SOURCE_DIR}")
endif()
if(NOT _moex_cjson_from)
  message(FATAL_ERROR "moex: cJSON not found (neither pkg-config's libcjson nor cjson/cJSON.h with the "
                      "library cjson): install it (Debian, Ubuntu: libcjson-dev), point CMAKE_PREFIX_PATH "
                      "at where it is, or give its sources with -DMOEX_CJSON_SOURCE_DIR=DIR (cJSON.c, cJSON.h)")
endif()
message(STATUS "moex: cJSON: ${_moex_cjson_from}")
