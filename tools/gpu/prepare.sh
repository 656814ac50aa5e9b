#!/usr/bin/env bash
# prepare.sh - run on the development machine (Debian/Ubuntu with a package registry) before a GPU
# run: downloads, without installing, the Debian packages of every build dependency a bare GPU
# machine lacks (it has the CUDA toolkit with NCCL, CMake, ninja, python3 with torch and
# transformers, and no registry) into build-deps/debs (ignored by git, copied along with the tree).
# tests/gpu/run.sh unpacks them there with dpkg -x into a private prefix; nothing is ever installed
# on the GPU machine. The set is the dependency closure of the packages below minus the toolchain and
# the base system every image has (EXCLUDE).
#   tools/gpu/prepare.sh [--list]     (--list: print the package names only)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dest=$root/build-deps/debs
TOP="libpcre2-dev libpcre2-8-0 libcjson-dev libutf8proc-dev libopenmpi-dev openmpi-bin libmicrohttpd-dev"
# the toolchain, the C/C++ runtime, shells and base libraries of any image, documentation, X11 and
# terminal libraries the MPI tools pull in, and the TLS development chain of libmicrohttpd-dev (its
# headers do not need it)
EXCLUDE='^(gcc|cpp|g\+\+|gfortran|flang|libflang|libclang|llvm|clang|libllvm|libmlir|libz3|binutils|autoconf|automake|autotools-dev|m4$|libtool$|make$|libc6|libc-dev-bin|linux-libc-dev|libcrypt|perl|libperl|python|libpython|dpkg|debconf|cdebconf|adduser|debianutils|install-info|tar$|passwd|login|openssh|libasan|libtsan|libubsan|liblsan|libhwasan|libitm|libquadmath|libgomp|libatomic|libcc1|libgcc|libstdc\+\+|libgprofng|libbinutils|libctf|libisl|libmpc|libmpfr|libdebian-installer|libobjc|libgfortran-|libjs-|libxml2|libicu|libedit|libffi|libbsd|libmd0|libtinfo|libncurses|libreadline|readline-common|libnewt|libslang|libtextwrap|libx11|libxau|libxcb|libxdmcp|libxext|libxnvctrl|ocl-icd|libselinux|libsystemd|libzstd|liblzma|libbz2|zlib1g|libacl1|libattr1|libaudit|libcap|libpam|libsemanage|libsepol|libdb5|libgdbm|libuuid|libblkid|libmount|libudev|libgmp|libhogweed|libnettle|nettle-dev|libgnutls|libidn2|libp11-kit|libtasn1|libunistring|libunbound|libkrb|libk5crypto|libgssapi|libcom-err|libkeyutils|libssl|openssl|libsqlite|libexpat|libgpg|libgcrypt|liblz4|libjansson|libcbor|libfido|ucf|sensible-utils|lsb-base|sysvinit|init-system|procps|libprocps|mount$|util-linux|gpgv|base-files|bash$|coreutils|libnsl|libtirpc|rpcsvc-proto)|-doc$'
command -v apt-cache >/dev/null || { echo "prepare.sh: needs apt-cache/apt-get download (a Debian or Ubuntu machine)" >&2; exit 1; }
# shellcheck disable=SC2086
pkgs=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
         --no-enhances $TOP 2>/dev/null | grep -v '^[ <]' | sort -u | grep -Ev "$EXCLUDE" || true)
for p in $TOP; do echo "$pkgs" | grep -qx "$p" || pkgs="$pkgs"$'\n'"$p"; done
pkgs=$(echo "$pkgs" | grep -v '^$' | sort -u)
if [ "${1:-}" = "--list" ]; then echo "$pkgs"; exit 0; fi
mkdir -p "$dest"
rm -f "$dest"/*.deb
cd "$dest"
# shellcheck disable=SC2086
apt-get download $pkgs >"$dest/download.log" 2>&1 || { echo "prepare.sh: apt-get download failed:" >&2; tail -5 "$dest/download.log" >&2; exit 1; }
{ echo "# packages for tests/gpu/run.sh, downloaded $(date -u +%F) on $(. /etc/os-release; echo "$PRETTY_NAME")"; ls -1 *.deb; } >"$dest/MANIFEST"
echo "prepare.sh: $(ls -1 *.deb | wc -l) packages, $(du -sh "$dest" | cut -f1) in ${dest#$root/}"
