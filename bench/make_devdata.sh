#!/usr/bin/env bash
# Makes .devdata/ (git-ignored), what a device call needs to build dspark on
# the GPU machine, which has nvcc and CMake but none of our Debian libraries
# and cannot reach a package registry:
#   .devdata/debs/      bookworm .debs of cJSON, PCRE2, utf8proc and pkgconf
#   .devdata/devenv.sh  sourced on the device: unpacks the .debs into
#                       .devdata/root, builds a plain-C cblas_sgemm stand-in for
#                       OpenBLAS (the real library, 36 MB, does not fit the
#                       64 MiB a call may carry; it only serves the CPU backend
#                       as test_cuda_ops' oracle in its wide matmul cases —
#                       nothing timed touches it) and exports PKG_CONFIG.
# Usage (here):   bash bench/make_devdata.sh
# On the device:  source .devdata/devenv.sh && cmake ... -DPKG_CONFIG_EXECUTABLE=$PKG_CONFIG
set -euo pipefail
cd "$(dirname "$0")/.."
D=.devdata
mkdir -p $D/debs
(cd $D/debs && apt-get download libcjson1 libcjson-dev libpcre2-8-0 libpcre2-dev libpcre2-16-0 libpcre2-32-0 \
    libpcre2-posix3 libutf8proc2 libutf8proc-dev pkgconf pkgconf-bin libpkgconf3 2>&1 | grep -v "^W:" || true)

cat >$D/devenv.sh <<'EOF'
# Sourced on the device from the repository root (see bench/make_devdata.sh).
_dd=$PWD/.devdata
_r=$_dd/root
_lib=$_r/usr/lib/x86_64-linux-gnu
if [ ! -f "$_r/.unpacked" ]; then
    mkdir -p "$_r"
    for f in "$_dd"/debs/*.deb; do dpkg -x "$f" "$_r"; done
    mkdir -p "$_r/usr/include" "$_lib/pkgconfig"
    cat >"$_r/usr/include/cblas.h" <<'H'
#ifndef DEVDATA_CBLAS_H
#define DEVDATA_CBLAS_H
enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112, CblasConjTrans = 113 };
typedef enum CBLAS_ORDER CBLAS_LAYOUT;
void cblas_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int m, int n, int k,
                 float alpha, const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);
void openblas_set_num_threads(int n);
#endif
H
    cat >"$_dd/cblas_standin.c" <<'C'
#include <cblas.h>
/* Reference GEMM: C = alpha op(A) op(B) + beta C, for the CPU oracle only. */
void cblas_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int m, int n, int k,
                 float alpha, const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc) {
    if (order == CblasColMajor) { /* C^T = op(B)^T op(A)^T in row-major terms */
        const float *t = a; a = b; b = t;
        int tl = lda; lda = ldb; ldb = tl;
        enum CBLAS_TRANSPOSE tt = ta; ta = tb; tb = tt;
        int tm = m; m = n; n = tm;
    }
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int p = 0; p < k; p++) {
                float x = ta == CblasNoTrans ? a[(long)i * lda + p] : a[(long)p * lda + i];
                float y = tb == CblasNoTrans ? b[(long)p * ldb + j] : b[(long)j * ldb + p];
                s += (double)x * y;
            }
            float *o = &c[(long)i * ldc + j];
            *o = (float)(alpha * s + (beta == 0.0f ? 0.0 : (double)beta * *o));
        }
}
void openblas_set_num_threads(int n) { (void)n; }
C
    cc -O2 -fPIC -shared -I"$_r/usr/include" "$_dd/cblas_standin.c" -o "$_lib/libopenblas.so"
    printf 'prefix=/usr\nlibdir=${prefix}/lib/x86_64-linux-gnu\nincludedir=${prefix}/include\nName: openblas\nDescription: cblas_sgemm stand-in\nVersion: 0.3.21\nLibs: -L${libdir} -lopenblas\nCflags: -I${includedir}\n' \
        >"$_lib/pkgconfig/openblas.pc"
    touch "$_r/.unpacked"
fi
export LD_LIBRARY_PATH=$_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PKG_CONFIG_SYSROOT_DIR=$_r
export PKG_CONFIG_LIBDIR=$_lib/pkgconfig:$_r/usr/share/pkgconfig
export PKG_CONFIG=$_r/usr/bin/pkgconf
EOF
echo "made $D ($(du -sh $D | cut -f1))"
