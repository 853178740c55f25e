"""Writes a generated file whole or not at all, for the emulation's rewriters
(extract_flash_kernels.py, extract_cuda_ops.py): a temporary beside the target, flushed to the
disk and renamed over it, so that an interrupted build never leaves half a file that the next
build would take as up to date. A target that exists but is not a regular file (a link, a
directory) is refused rather than written through."""
import os
import sys


def write_whole(output_path, text):
    if os.path.lexists(output_path) and not (os.path.isfile(output_path)
                                             and not os.path.islink(output_path)):
        sys.exit(f"{output_path}: exists and is not a regular file; not replacing it")
    temporary = output_path + ".tmp"
    with open(temporary, "w", encoding="utf-8") as output:
        output.write(text)
        output.flush()
        os.fsync(output.fileno())
    os.replace(temporary, output_path)
