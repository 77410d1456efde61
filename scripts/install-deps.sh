#!/usr/bin/env bash
# Installs the Debian 12 packages spark builds with; with --tests also what its test suite and
# checked builds use (.ci/run). Nothing else is downloaded.
#   scripts/install-deps.sh [--tests]
set -euo pipefail
tests=0
case "${1:-}" in
--tests) tests=1 ;;
"") ;;
*) echo "usage: scripts/install-deps.sh [--tests]" >&2; exit 2 ;;
esac
packages=(
    build-essential cmake ninja-build pkg-config git
    libeigen3-dev          # CPU matmuls
    nlohmann-json3-dev     # config.json, tokenizer.json
    libpcre2-dev           # tokenizer pre-split regex (Unicode classes, JIT)
    libutf8proc-dev        # NFC normalisation
    doctest-dev            # unit tests (configured with the rest)
    libcli11-dev           # command lines
    libedit-dev            # spark-chat line editing
    libcpp-httplib-dev     # spark-server's HTTP
)
if [ $tests -eq 1 ]; then
    packages+=(
        python3                # small test scripts
        python3-venv           # the openai client's environment for spark-server's tests (below)
        chromium python3-websocket  # spark-server's chat page, tested in headless Chromium
        clang libclang-rt-14-dev    # sanitizer and libFuzzer builds (scripts/check.sh, scripts/fuzz.sh)
    )
fi
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# The official openai Python client (PyPI), which spark-server's tests talk through, in a virtual
# environment of the checkout (.venv, git-ignored): Debian's own Python takes no pip packages.
venv="$(cd "$(dirname "$0")/.." && pwd)/.venv"
if [ $tests -eq 1 ] && ! "$venv/bin/python" -c "import openai" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "openai>=1.40,<4"
fi
