#!/usr/bin/env bash
# Makes .devdata/llama.cpp.tar.xz: a trimmed source tree of upstream
# ggml-org/llama.cpp, enough to build llama-bench with the CUDA (+ CPU)
# backend on x86-64 (+ llama-quantize, for the Q8_0 / Q4_0 files) and to run
# convert_hf_to_gguf.py on a Qwen3 checkpoint.
# The tarball is carried to the device (bench/run_llamacpp.sh unpacks it);
# it is a peer baseline, not part of the project, and is never committed.
# See bench/fetch_llamacpp.md for what is kept and why.
#
# usage: bash bench/make_llamacpp_tarball.sh GIT_DIR [COMMIT] [OUT]
#   GIT_DIR  any clone (bare or not) of ggml-org/llama.cpp, or of a fork
#            that holds the commit
#   COMMIT   default 34af94cd9ab277632e27caeec2d41de2fd091b31 (upstream
#            master, 2026-08-17, "ci : push release tag explicitly in
#            release.yml (#27261)")
#   OUT      default .devdata/llama.cpp.tar.xz
set -euo pipefail
cd "$(dirname "$0")/.."
G=${1:?usage: make_llamacpp_tarball.sh GIT_DIR [COMMIT] [OUT]}
C=${2:-34af94cd9ab277632e27caeec2d41de2fd091b31}
O=${3:-.devdata/llama.cpp.tar.xz}
C=$(git --git-dir="$G" rev-parse --verify "$C^{commit}")

T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/llama.cpp"

# Kept: the top-level CMake project, libllama, libggml (base + CPU + CUDA),
# llama-common (llama-bench links it) with the two vendored libraries it
# needs, llama-bench, llama-quantize (tools/quantize, less its README and
# tests.sh), and the HF -> GGUF converter with its gguf-py package.
# Dropped inside what is kept: the other CPU architectures (arm, riscv,
# powerpc, loongarch, s390, wasm, kleidiai, spacemit), the fattn-vec template
# instances only GGML_CUDA_FA_ALL_QUANTS=ON compiles (the four it compiles
# otherwise are kept), gguf-py's tests, examples and GUI editor.
git --git-dir="$G" archive --format=tar "$C" -- \
    LICENSE CMakeLists.txt cmake include src common \
    convert_hf_to_gguf.py conversion gguf-py \
    tools/CMakeLists.txt tools/llama-bench tools/quantize \
    ':(exclude)tools/quantize/README.md' ':(exclude)tools/quantize/tests.sh' \
    vendor/nlohmann vendor/cpp-httplib vendor/sheredom \
    ggml/CMakeLists.txt ggml/cmake ggml/include ggml/src/CMakeLists.txt \
    ':(glob)ggml/src/*.c' ':(glob)ggml/src/*.cpp' ':(glob)ggml/src/*.h' \
    ggml/src/ggml-cpu ggml/src/ggml-cuda \
    ':(exclude)ggml/src/ggml-cpu/arch/arm' ':(exclude)ggml/src/ggml-cpu/arch/riscv' \
    ':(exclude)ggml/src/ggml-cpu/arch/powerpc' ':(exclude)ggml/src/ggml-cpu/arch/loongarch' \
    ':(exclude)ggml/src/ggml-cpu/arch/s390' ':(exclude)ggml/src/ggml-cpu/arch/wasm' \
    ':(exclude)ggml/src/ggml-cpu/kleidiai' ':(exclude)ggml/src/ggml-cpu/spacemit' \
    ':(exclude)ggml/src/ggml-cuda/template-instances/fattn-vec-*' \
    ':(exclude)gguf-py/tests' ':(exclude)gguf-py/examples' \
    ':(exclude)gguf-py/gguf/scripts/gguf_editor_gui.py' |
    tar -x -C "$T/llama.cpp"
for f in f16-f16 q4_0-q4_0 q8_0-q8_0 bf16-bf16; do
    p=ggml/src/ggml-cuda/template-instances/fattn-vec-instance-$f.cu
    git --git-dir="$G" show "$C:$p" >"$T/llama.cpp/$p"
done

# tools/CMakeLists.txt adds every tool; only llama-bench and llama-quantize
# are shipped.
cat >"$T/llama.cpp/tools/CMakeLists.txt" <<'EOF'
# trimmed by dspark bench/make_llamacpp_tarball.sh: only llama-bench and llama-quantize are shipped
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(llama-bench)
add_subdirectory(quantize)
EOF
# No .git in the tree: build-info gets the commit and build number (the
# upstream release tag bN counts the commits) from here.
printf '%s\n' "$C" >"$T/llama.cpp/COMMIT"
git --git-dir="$G" rev-list --count "$C" >"$T/llama.cpp/BUILD_NUMBER"

mkdir -p "$(dirname "$O")"
tar -C "$T" --owner=0 --group=0 --numeric-owner --sort=name --mtime=@0 -cf - llama.cpp | xz -9e -T1 >"$O"
echo "$O: $(stat -c %s "$O") bytes, commit $C, $(tar -tJf "$O" | grep -vc '/$') files"
