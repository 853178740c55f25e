#!/usr/bin/env python3
"""The device part of backend/ops/attention_flash_cuda.cu, for the warp emulation
(warp_emulator.hpp): everything from its anonymous namespace up to the host side (the shared
memory carves and their sizes included), and the host side's make_flash_shape, with the inline
PTX of the mma, cp.async and ldmatrix wrappers forwarded to the emulator's functions of the same
names, the dynamic shared memory taken from the emulated block and nvcc's `#pragma unroll` hints
dropped. Fails, naming what it did not find, when the file's shape changes.
Usage: extract_flash_kernels.py attention_flash_cuda.cu output.inc"""
import re
import sys

from whole_file import write_whole


def main(source_path, output_path):
    source = open(source_path, encoding="utf-8").read()

    def need(found, what):
        if not found:
            sys.exit(f"{source_path}: {what} not found; update tests/gpu/emulation/"
                     "extract_flash_kernels.py to the kernel file's new shape")

    begin_marker = "namespace backend::cuda {\nnamespace {\n"
    end_marker = "// ---- host side"
    need(begin_marker in source, "the anonymous namespace inside backend::cuda")
    need(end_marker in source, f"the '{end_marker}' comment")
    device_part = source[source.index(begin_marker) + len(begin_marker):source.index(end_marker)]
    need("shared_bytes_of(" in device_part, "shared_bytes_of, the launches' shared-memory sizes")
    # The host side's FlashShape maker, so the test launches with the shape the op would.
    shape_maker = re.search(r"FlashShape make_flash_shape\(.*?\n\}\n", source, flags=re.S)
    need(shape_maker, "make_flash_shape")

    # The wrappers of inline PTX, each body forwarded to the emulator's function of the same
    # name and arguments: (the wrapper's signature as the kernel file writes it, the new body).
    wrappers = [
        ("template <typename E>\n__device__ inline void mma(float (&d)[4], "
         "const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {\n",
         "warp_emulator::mma_m16n8k16<E>(d, a, b0, b1);", "the mma<E>(d, a, b0, b1) wrapper"),
        ("__device__ inline void copy_16_async(void* shared, const void* global, bool valid) {\n",
         "warp_emulator::copy_16_async(shared, global, valid);", "copy_16_async (cp.async)"),
        ("__device__ inline void commit_copies() {\n", "warp_emulator::commit_copies();",
         "commit_copies (cp.async.commit_group)"),
        ("template <int Pending>\n__device__ inline void wait_copies() {\n",
         "warp_emulator::wait_copies(Pending);", "wait_copies<Pending> (cp.async.wait_group)"),
        ("template <bool Transposed>\n__device__ inline void load_matrices(uint32_t (&r)[4], "
         "const void* row) {\n",
         "warp_emulator::load_matrices<Transposed>(r, row);", "load_matrices (ldmatrix)"),
    ]
    for signature, body, what in wrappers:
        wrapper = re.compile(re.escape(signature) + r".*?\n\}\n", flags=re.S)
        need(len(wrapper.findall(device_part)) == 1, what)
        device_part = wrapper.sub(lambda m: signature + "  " + body + "\n}\n", device_part)
    shared = "extern __shared__ __align__(16) unsigned char shared_bytes[];"
    need(shared in device_part, "the kernels' dynamic shared memory declaration")
    device_part = device_part.replace(shared, "unsigned char* shared_bytes = warp_emulator::block->shared;")
    need(not re.search(r"\basm\b", device_part), "no other inline assembly (found one)")
    # nvcc's unroll hints: the host compiler's -Wunknown-pragmas would stop the build.
    device_part = re.sub(r"^#pragma unroll[^\n]*\n", "", device_part, flags=re.M)

    write_whole(output_path, f"// Generated from {source_path} by extract_flash_kernels.py: do not edit.\n"
                + device_part + shape_maker.group(0))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
