#!/usr/bin/env bash
# Sourced at the start of every run on the lent GPU machine (it has CUDA, cmake and ninja but none of
# our Debian packages and no network): unpacks the carried .deb files of the build dependencies into
# /tmp/spark-deps and points CMake, pkg-config and the loader at them.

root=/tmp/spark-deps
if [ ! -d "$root/usr" ]; then
    mkdir -p "$root"
    for f in .deps/debs/*.deb; do dpkg -x "$f" "$root"; done
fi
export CMAKE_PREFIX_PATH=$root/usr
export PKG_CONFIG_PATH=$root/usr/lib/x86_64-linux-gnu/pkgconfig
export PKG_CONFIG_SYSROOT_DIR=$root
export LD_LIBRARY_PATH=$root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export CPATH=$root/usr/include:${CPATH:-}
