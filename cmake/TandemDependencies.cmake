# Every dependency comes from a Debian 12 package; scripts/setup.sh installs them.
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
pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)
