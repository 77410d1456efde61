#!/usr/bin/env bash
# The installed package as a host program finds it (cmake --install BUILD --prefix TMP):
#   find_package(spark): a project of C only and one of C and C++ link examples/simple/simple.c
#   against spark::spark (libspark.so) and spark::spark_static (libspark.a);
#   pkg-config spark: simple.c linked with `--cflags --libs` (libspark.so) and, with libspark.a alone
#   in the prefix, `--static --libs` (its private dependencies must all be listed: without --static
#   the link must fail), and a fully static program (`cc -static`; CPU builds without sanitizers);
#   each of those programs prints the greedy continuation that transformers computed for the
#   qwen3-bf16 fixture (its golden.safetensors), on the CPU;
#   the installed programs find libspark through their RUNPATH ($ORIGIN/../lib) with LD_LIBRARY_PATH
#   unset, and the installed spark-simple runs the installed demo model (share/spark/models) to its
#   golden tokens; the installed spark-chat takes the installed demo model as its default; the demo
#   models install verbatim, as their own component "models".
# A sanitized build's library needs its host built with the same sanitizers: the hosts get them.
# The build directory's install_manifest*.txt files are put back as they were.
set -uo pipefail
build=$(cd "$1" && pwd)
data=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
mkdir "$tmp/manifests"
cp -p "$build"/install_manifest*.txt "$tmp/manifests/" 2> /dev/null
cleanup() {
    rm -f "$build"/install_manifest*.txt
    cp -p "$tmp"/manifests/* "$build/" 2> /dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
fails=0
fail() { echo "FAIL $1"; [ -f "$tmp/err" ] && tail -30 "$tmp/err"; fails=$((fails + 1)); }
ok() { echo "ok   $1"; }

cache() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt"; }
cmake=$(cache CMAKE_COMMAND)
cc=$(cache CMAKE_C_COMPILER)
cxx=$(cache CMAKE_CXX_COMPILER)
sanitize=$(cache SPARK_SANITIZE)
prefix=$tmp/prefix
libdir=$prefix/$(cache CMAKE_INSTALL_LIBDIR)
bindir=$prefix/$(cache CMAKE_INSTALL_BINDIR)
datadir=$(cache CMAKE_INSTALL_DATADIR)  # empty: GNUInstallDirs' default, the DATAROOTDIR
models=$prefix/${datadir:-$(cache CMAKE_INSTALL_DATAROOTDIR)}/spark/models
cflags=() ldflags=() cstdlibs=""
if [ -n "$sanitize" ]; then  # as cmake/SparkSanitizers.cmake builds spark's own programs
    cflags=("-fsanitize=$sanitize" -fno-omit-frame-pointer)
    ldflags=("-fsanitize=$sanitize")
    if [[ $sanitize == *undefined* ]] && "$cc" --version | grep -q clang; then
        ldflags+=(-fsanitize-link-c++-runtime)
        cstdlibs=-lstdc++
    fi
fi
# The programs run on the CPU whatever the build and the machine (the default device is a GPU when
# there is one; the golden tokens are checked on the CPU, as tests/models does).
export CUDA_VISIBLE_DEVICES=-1
unset LD_LIBRARY_PATH

# Greedy continuation check: the program's 16 tokens after the fixture's prompt are transformers'.
read_golden() {  # read_golden DIR: two lines, the prompt's ids and the greedy ids
    python3 - "$1/golden.safetensors" <<'PY'
import json, struct, sys
f = open(sys.argv[1], 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n)); d = f.read()
for k in ('prompt', 'greedy'):
    a, b = h[k]['data_offsets']
    print(' '.join(str(x) for x in struct.unpack('<%di' % ((b - a) // 4), d[a:b])))
PY
}
fixture=$data/models/qwen3-bf16
{ read -r prompt; read -r greedy; } < <(read_golden "$fixture")
expected=$(echo "$greedy" | tr ' ' '\n' | head -16 | tr '\n' ' ')
if [ -z "$prompt" ] || [ "$(echo "$expected" | wc -w)" -ne 16 ]; then
    echo "FAIL no golden prompt and 16 greedy tokens read from $fixture/golden.safetensors"; exit 1
fi
runs_golden() {  # runs_golden NAME PROGRAM [ENV...]: PROGRAM MODEL 16 PROMPT prints the golden tokens
    local name=$1 prog=$2
    shift 2
    # shellcheck disable=SC2086
    got=$(env "$@" "$prog" "$fixture" 16 $prompt 2> "$tmp/err" | tr '\n' ' ')
    if [ "$got" = "$expected" ]; then ok "$name: runs, golden greedy tokens"; else fail "$name: got '$got', want '$expected'"; fi
}
links_spark_from() {  # links_spark_from NAME PROGRAM DIR [ENV...]: the dynamic loader takes libspark from DIR
    local name=$1 prog=$2 dir=$3
    shift 3
    local line so
    line=$(env "$@" ldd "$prog" | grep 'libspark\.so')
    so=$(echo "$line" | sed -n 's/^[[:space:]]*libspark\.so\.[0-9]* => \(\/[^ ]*\) .*/\1/p')
    if [ -n "$so" ] && [ "$(realpath "$(dirname "$so")")" = "$(realpath "$dir")" ]; then
        ok "$name: libspark from the prefix"
    else
        fail "$name: libspark is not taken from $dir:$line"
    fi
}
no_libspark_needed() {  # the program carries libspark.a's code, not a dependency on libspark.so
    if readelf -d "$2" | grep -q 'NEEDED.*libspark'; then fail "$1: needs libspark.so"; else ok "$1: no libspark.so needed"; fi
}

# --- install ---
"$cmake" --install "$build" --prefix "$prefix" > "$tmp/err" 2>&1 || fail "cmake --install: exit code $?"
[ -f "$prefix/include/spark/spark.h" ] || fail "not installed: include/spark/spark.h"
for f in libspark.a libspark.so pkgconfig/spark.pc cmake/spark/spark-config.cmake cmake/spark/spark-config-version.cmake \
         cmake/spark/spark-targets.cmake cmake/spark/spark-static-targets.cmake; do
    [ -e "$libdir/$f" ] || fail "not installed: $libdir/$f"
done
[ $fails -eq 0 ] && ok "installed: header, libspark.so, libspark.a, CMake package, spark.pc"

# --- installed programs: RUNPATH, and the demo models (they come with the examples) ---
if [ "$(cache SPARK_BUILD_EXAMPLES)" = OFF ]; then
    echo "skip programs and demo models: SPARK_BUILD_EXAMPLES=OFF"
else
    for prog in "$bindir"/spark-*; do
        if readelf -d "$prog" | grep -q 'NEEDED.*libspark'; then
            links_spark_from "$(basename "$prog")" "$prog" "$libdir"
        fi
    done
    demo=$models/spark-demo-coder-moe
    if [ -x "$bindir/spark-simple" ] && [ -d "$demo" ]; then
        { read -r dprompt; read -r dgreedy; } < <(read_golden "$demo")
        want=$(echo "$dgreedy" | tr ' ' '\n' | head -8 | tr '\n' ' ')
        # shellcheck disable=SC2086
        got=$("$bindir/spark-simple" "$demo" 8 $dprompt 2> "$tmp/err" | tr '\n' ' ')
        if [ -z "$dprompt" ] || [ "$(echo "$want" | wc -w)" -ne 8 ]; then
            fail "no golden tokens read from $demo/golden.safetensors"
        elif [ "$got" = "$want" ]; then
            ok "installed spark-simple runs the installed demo model: golden tokens"
        else
            fail "installed spark-simple on $demo: got '$got', want '$want'"
        fi
        runs_golden "installed spark-simple" "$bindir/spark-simple"
    else
        fail "not installed: $bindir/spark-simple or $demo"
    fi
    chat=$bindir/spark-chat  # its default model is the installed one (examples/chat/chat.cpp)
    if [ -x "$chat" ]; then
        if "$chat" --help 2> "$tmp/err" | grep -qF -- "$(realpath "$models")/spark-demo-coder-moe"; then
            ok "installed spark-chat: the installed demo model is its default"
        else
            fail "installed spark-chat: --help does not show $models/spark-demo-coder-moe as the default model"
        fi
        if out=$("$chat" -p 'Write a Python function add(a, b) that returns the sum.' --temp 0 -n 8 -t 1 2> "$tmp/err") && [ -n "$out" ]; then
            ok "installed spark-chat answers with its default model"
        else
            fail "installed spark-chat without -m: no answer"
        fi
    fi
    if diff -r -x CMakeLists.txt "$root/examples/models" "$models" > "$tmp/err" 2>&1; then
        ok "demo models installed verbatim in share/spark/models ($(find "$models" -mindepth 1 -maxdepth 1 -type d | wc -l) models)"
    else
        fail "share/spark/models differs from examples/models"
    fi
    "$cmake" --install "$build" --prefix "$tmp/models-only" --component models > "$tmp/err" 2>&1 || fail "--component models: exit code $?"
    others=$(cd "$tmp/models-only" && find . -type f ! -path "./${models#"$prefix"/}/*")
    if [ -z "$others" ] && [ -f "$tmp/models-only/${models#"$prefix"/}/spark-demo-coder-moe/model.safetensors" ]; then
        ok "--component models installs the models only"
    else
        fail "--component models: $(echo "$others" | head -3)"
    fi
    "$cmake" --install "$build" --prefix "$tmp/lib-only" --component Unspecified > "$tmp/err" 2>&1 || fail "--component Unspecified: exit code $?"
    if [ ! -e "$tmp/lib-only/${models#"$prefix"/}" ] && [ -f "$tmp/lib-only/${libdir#"$prefix"/}/pkgconfig/spark.pc" ]; then
        ok "--component Unspecified installs the library without the models"
    else
        fail "--component Unspecified"
    fi
fi

# --- find_package(spark) ---
version=$(PKG_CONFIG_PATH=$libdir/pkgconfig pkg-config --modversion spark)
mkdir -p "$tmp/host"
cp "$root/examples/simple/simple.c" "$tmp/host/"
cat > "$tmp/host/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.16)
project(host LANGUAGES \${HOST_LANGUAGES})
add_link_options(\${HOST_LINK_OPTIONS})  # those of a sanitized libspark (empty otherwise)
find_package(spark $version REQUIRED COMPONENTS shared static)
add_executable(host-shared simple.c)
target_link_libraries(host-shared PRIVATE spark::spark)
add_executable(host-static simple.c)
target_link_libraries(host-static PRIVATE spark::spark_static)
EOF
gen=()
command -v ninja > /dev/null && gen=(-G Ninja)
for langs in "C" "C;CXX"; do
    b=$tmp/host-build-${langs/;/-}
    if "$cmake" -S "$tmp/host" -B "$b" "${gen[@]}" -DHOST_LANGUAGES="$langs" -DCMAKE_PREFIX_PATH="$prefix" \
            -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Release \
            -DCMAKE_C_FLAGS="${cflags[*]}" -DHOST_LINK_OPTIONS="$(IFS=';'; echo "${ldflags[*]}${cstdlibs:+;$cstdlibs}")" \
            > "$tmp/err" 2>&1 &&
        "$cmake" --build "$b" > "$tmp/err" 2>&1; then
        ok "find_package(spark $version) in a project of $langs: spark::spark and spark::spark_static link"
        runs_golden "find_package ($langs) spark::spark" "$b/host-shared"
        links_spark_from "find_package ($langs) spark::spark" "$b/host-shared" "$libdir"
        runs_golden "find_package ($langs) spark::spark_static" "$b/host-static"
        no_libspark_needed "find_package ($langs) spark::spark_static" "$b/host-static"
    else
        fail "find_package(spark) in a project of $langs: configure or build failed"
    fi
done

# --- pkg-config spark ---
export PKG_CONFIG_PATH=$libdir/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
simple=$root/examples/simple/simple.c
# shellcheck disable=SC2046
if "$cc" "${cflags[@]}" -o "$tmp/pc-shared" "$simple" $(pkg-config --cflags --libs spark) "${ldflags[@]}" $cstdlibs 2> "$tmp/err"; then
    ok "cc \$(pkg-config --cflags --libs spark): links"
    runs_golden "pkg-config spark" "$tmp/pc-shared" LD_LIBRARY_PATH="$libdir"
    links_spark_from "pkg-config spark" "$tmp/pc-shared" "$libdir" LD_LIBRARY_PATH="$libdir"
else
    fail "cc \$(pkg-config --cflags --libs spark) did not link"
fi
cuda=$(grep -c '^set(spark_CUDA ON)' "$libdir/cmake/spark/spark-config.cmake")
if [ -z "$sanitize" ] && [ "$cuda" = 0 ]; then  # a fully static program (not with CUDA's runtime, nor sanitizers)
    # shellcheck disable=SC2046
    if "$cc" -static -o "$tmp/pc-full-static" "$simple" $(pkg-config --cflags --static --libs spark) 2> "$tmp/err"; then
        runs_golden "cc -static \$(pkg-config --cflags --static --libs spark)" "$tmp/pc-full-static"
        if readelf -d "$tmp/pc-full-static" | grep -q NEEDED; then fail "cc -static: the program needs shared libraries"; fi
    else
        fail "cc -static \$(pkg-config --cflags --static --libs spark) did not link"
    fi
fi
# libspark.a alone: the linker takes it for -lspark, and only --static lists what it needs.
rm -f "$libdir"/libspark.so*
# shellcheck disable=SC2046
if "$cc" "${cflags[@]}" -o "$tmp/pc-nostatic" "$simple" $(pkg-config --cflags --libs spark) "${ldflags[@]}" $cstdlibs > "$tmp/out" 2>&1; then
    fail "libspark.a linked without pkg-config --static's libraries: the test proves nothing"
else
    ok "libspark.a does not link without --static's libraries"
fi
# shellcheck disable=SC2046
if "$cc" "${cflags[@]}" -o "$tmp/pc-static" "$simple" $(pkg-config --cflags --static --libs spark) "${ldflags[@]}" $cstdlibs 2> "$tmp/err"; then
    ok "cc \$(pkg-config --cflags --static --libs spark): links libspark.a ($(pkg-config --static --libs spark))"
    runs_golden "pkg-config --static spark" "$tmp/pc-static"
    no_libspark_needed "pkg-config --static spark" "$tmp/pc-static"
else
    fail "cc \$(pkg-config --cflags --static --libs spark) did not link"
fi

[ $fails -eq 0 ] || exit 1
echo "installed package (find_package, pkg-config, RUNPATH, models): ok"
