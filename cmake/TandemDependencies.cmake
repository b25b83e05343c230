# Every dependency but xgrammar comes from a Debian 12 package; scripts/setup.sh installs them.
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)
# PCRE2 gives the tokenizer's pre-tokenizer Unicode property classes (\p{L}, \p{N}).
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
# utf8proc gives the tokenizer's NFC normaliser.
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET libutf8proc)

find_package(Protobuf CONFIG QUIET)
if(NOT Protobuf_FOUND)
  find_package(Protobuf REQUIRED)
endif()
find_package(gRPC CONFIG REQUIRED)
find_program(TANDEM_PROTOC protoc REQUIRED)
find_program(TANDEM_GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)

# The fuzz build fuzzes the parsers, the request decoders included: protobuf and gRPC, nothing
# more.
if(TANDEM_FUZZERS)
  return()
endif()

find_package(prometheus-cpp CONFIG REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
# Debian ships cpp-httplib as a compiled library with a pkg-config file and no CMake config.
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
find_package(GTest CONFIG REQUIRED)
find_package(OpenMP REQUIRED)
# Debian's hiredis CMake config points at missing files: use pkg-config instead.
pkg_check_modules(HIREDIS REQUIRED IMPORTED_TARGET hiredis)
# TLS to Redis: hiredis 0.14 has none, so the Redis client runs its protocol over OpenSSL itself.
find_package(OpenSSL REQUIRED)
pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)

# xgrammar's C++ core constrains decoding to JSON schemas and tool-call formats
# (worker/sampling/grammar.h). No Debian package carries it; its source distribution on PyPI
# does, and CMake fetches that, pinned by hash, when it configures a build. To build without the
# network, unpack the same archive and pass -DFETCHCONTENT_SOURCE_DIR_XGRAMMAR=<its directory>.
# Only the C++ core is built (no Python bindings), with our flags and its warnings off.
include(FetchContent)
FetchContent_Declare(xgrammar
  URL https://files.pythonhosted.org/packages/03/0f/29f521535729be740779c2c98b630ef6607cf28be9b669895dd2b821ff63/xgrammar-0.2.8.tar.gz
  URL_HASH SHA256=8305646fd2b319d6c3003f51a1665e54cbbe9cba1fb636bc41d0b46434ccbb80
  DOWNLOAD_EXTRACT_TIMESTAMP TRUE)
FetchContent_GetProperties(xgrammar)
if(NOT xgrammar_POPULATED)
  FetchContent_Populate(xgrammar)
endif()
file(GLOB_RECURSE TANDEM_XGRAMMAR_SOURCES CONFIGURE_DEPENDS "${xgrammar_SOURCE_DIR}/cpp/*.cc")
# The tvm_ffi folder holds the Python bindings.
list(FILTER TANDEM_XGRAMMAR_SOURCES EXCLUDE REGEX "/cpp/tvm_ffi/")
add_library(tandem_xgrammar STATIC ${TANDEM_XGRAMMAR_SOURCES})
target_include_directories(tandem_xgrammar SYSTEM PUBLIC "${xgrammar_SOURCE_DIR}/include")
target_include_directories(tandem_xgrammar SYSTEM PUBLIC "${xgrammar_SOURCE_DIR}/3rdparty/picojson"
                           "${xgrammar_SOURCE_DIR}/3rdparty/dlpack/include")
target_compile_definitions(tandem_xgrammar PUBLIC XGRAMMAR_ENABLE_CPPTRACE=0
                           XGRAMMAR_ENABLE_INTERNAL_CHECK=0)
target_compile_options(tandem_xgrammar PRIVATE -w)
set_target_properties(tandem_xgrammar PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_link_libraries(tandem_xgrammar PUBLIC Threads::Threads)
add_library(xgrammar::xgrammar ALIAS tandem_xgrammar)
