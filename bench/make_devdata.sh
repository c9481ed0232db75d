#!/usr/bin/env bash
# Makes .devdata/ (git-ignored), what a device call needs to build dspark on
# the GPU machine, which has nvcc and CMake but none of our Debian libraries
# and cannot reach a package registry:
#   .devdata/root.tar.xz  the few files of bookworm's cJSON, PCRE2 (8-bit),
#                         utf8proc, libmicrohttpd and pkgconf that a build needs
#                         (~0.4 MB: the tracked tree is ~60 MiB of the 64 MiB a
#                         call carries)
#   .devdata/tls.tar.xz   libmicrohttpd's runtime needs (GnuTLS and its
#                         libraries), unpacked only where the device lacks them
#   .devdata/devenv.sh    sourced on the device: unpacks it into .devdata/root
#                         and exports PKG_CONFIG.
#   .devdata/deepspec.tar.xz  DeepSpec's python package (deepspec/), the baseline
#                         bench/train_deepspec.py times; from a checkout at
#                         $DEEPSPEC (default: the fetched mirror), if there is one
# Usage (here):   bash bench/make_devdata.sh
# On the device (carry [".devdata/root.tar.xz", ".devdata/tls.tar.xz", ".devdata/devenv.sh"]):
#                 source .devdata/devenv.sh && cmake ... -DPKG_CONFIG_EXECUTABLE=$PKG_CONFIG
set -euo pipefail
cd "$(dirname "$0")/.."
D=$PWD/.devdata
mkdir -p $D/debs
(cd $D/debs && apt-get download libcjson1 libcjson-dev libpcre2-8-0 libpcre2-dev libutf8proc2 libutf8proc-dev \
    libmicrohttpd12 libmicrohttpd-dev pkgconf pkgconf-bin libpkgconf3 \
    libgnutls30 libnettle8 libhogweed6 libgmp10 libp11-kit0 libidn2-0 libunistring2 libtasn1-6 libffi8 \
    2>&1 | grep -v "^W:" || true)
tmp=$(mktemp -d)
for f in $D/debs/*.deb; do dpkg -x "$f" "$tmp"; done
L=usr/lib/x86_64-linux-gnu
# Linked dynamically, libmicrohttpd needs no GnuTLS .pc at build time.
sed -i '/^Requires.private/d' "$tmp/$L/pkgconfig/libmicrohttpd.pc"
(cd "$tmp" && tar -cJf $D/root.tar.xz usr/bin/pkgconf usr/include/cjson usr/include/pcre2.h usr/include/utf8proc.h \
    usr/include/microhttpd.h $L/libcjson.so* $L/libpcre2-8.so* $L/libpkgconf.so* $L/libutf8proc.so* \
    $L/libmicrohttpd.so* $L/pkgconfig/libcjson.pc $L/pkgconfig/libpcre2-8.pc $L/pkgconfig/libutf8proc.pc \
    $L/pkgconfig/libmicrohttpd.pc usr/share/pkgconfig)
(cd "$tmp" && tar -cJf $D/tls.tar.xz $L/libgnutls.so.30* $L/libnettle.so.8* $L/libhogweed.so.6* $L/libgmp.so.10* \
    $L/libp11-kit.so.0* $L/libidn2.so.0* $L/libunistring.so.2* $L/libtasn1.so.6* $L/libffi.so.8*)
rm -rf "$tmp"

cat >$D/devenv.sh <<'SH'
# Sourced on the device from the repository root (see bench/make_devdata.sh).
_dd=$PWD/.devdata
_r=$_dd/root
_lib=$_r/usr/lib/x86_64-linux-gnu
if [ ! -f "$_r/.unpacked" ]; then
    mkdir -p "$_r" && tar -xJf "$_dd/root.tar.xz" -C "$_r" && touch "$_r/.unpacked"
    # GnuTLS (libmicrohttpd's) from the tarball only where the system has none.
    if ! ldconfig -p | grep -q 'libgnutls.so.30 ' && [ -f "$_dd/tls.tar.xz" ]; then tar -xJf "$_dd/tls.tar.xz" -C "$_r"; fi
fi
# Without GnuTLS (none on the system, tls.tar.xz not carried) the build leaves the server out.
export DS_SERVE=ON
if ! ldconfig -p | grep -q 'libgnutls.so.30 ' && [ ! -e "$_lib/libgnutls.so.30" ]; then DS_SERVE=OFF; fi
# The CPU trainer's OpenBLAS is not in the tarball (4 MB more to carry): the GPU build leaves it out.
export DS_OPENBLAS=OFF
export LD_LIBRARY_PATH=$_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PKG_CONFIG_SYSROOT_DIR=$_r
export PKG_CONFIG_LIBDIR=$_lib/pkgconfig:$_r/usr/share/pkgconfig
export PKG_CONFIG=$_r/usr/bin/pkgconf
SH
DEEPSPEC=${DEEPSPEC:-/work/.mirror/deepseek-ai+DeepSpec/repo}
if [ -d "$DEEPSPEC" ]; then
  git -C "$DEEPSPEC" archive HEAD deepspec | xz -9 >$D/deepspec.tar.xz
  echo "made $D/deepspec.tar.xz ($(du -h $D/deepspec.tar.xz | cut -f1)) from $DEEPSPEC @ $(git -C "$DEEPSPEC" rev-parse --short HEAD)"
fi
echo "made $D/root.tar.xz ($(du -h $D/root.tar.xz | cut -f1)), $D/tls.tar.xz ($(du -h $D/tls.tar.xz | cut -f1))"
