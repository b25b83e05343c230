# Warnings as errors on our own code only (generated protobuf code is exempt). GCC 12 at -O3
# (Release) reports -Wrestrict on libstdc++'s own std::string concatenation (GCC bug 105329),
# and -Wmaybe-uninitialized on the destructor of a std::function member of an options struct
# built with designated initializers (services/drafter/main.cc, a false positive): still
# printed there, but not errors.
function(tandem_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Werror -Wno-missing-field-initializers>
    $<$<AND:$<COMPILE_LANG_AND_ID:CXX,GNU>,$<VERSION_LESS:$<CXX_COMPILER_VERSION>,13>>:-Wno-error=restrict -Wno-error=maybe-uninitialized>)
endfunction()

# tandem_library(NAME SOURCES ... [DEPS ...] [PRIVATE_DEPS ...])
function(tandem_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  tandem_warnings(${name})
endfunction()

# tandem_test(NAME SOURCES ... [DEPS ...] [LABELS ...])
# One GoogleTest binary; each TEST becomes a CTest test (discovered when ctest runs).
function(tandem_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gmock GTest::gtest_main)
  target_compile_definitions(${name} PRIVATE
    TANDEM_SOURCE_DIR="${PROJECT_SOURCE_DIR}" TANDEM_BINARY_DIR="${PROJECT_BINARY_DIR}")
  tandem_warnings(${name})
  gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST DISCOVERY_TIMEOUT 60
    PROPERTIES LABELS "${ARG_LABELS}")
  # The GPU kit (scripts/gpu/pack.sh) packs every test labelled cuda; tests/CMakeLists.txt
  # writes the list.
  if("cuda" IN_LIST ARG_LABELS)
    set_property(GLOBAL APPEND PROPERTY TANDEM_GPU_TEST_TARGETS ${name})
  endif()
endfunction()
