"""Writes a generated file whole or not at all, for the emulation's rewriters
(extract_flash_kernels.py, extract_cuda_ops.py): a temporary of a fresh name beside the target
(created exclusively, so nothing already there is written through), flushed to the disk and
renamed over it, so that an interrupted build never leaves half a file that the next build
would take as up to date; a failed write removes the temporary. A target that exists but is
not a regular file (a link, a directory) is refused rather than written through."""
import os
import sys
import tempfile


def write_whole(output_path, text):
    if os.path.lexists(output_path) and not (os.path.isfile(output_path)
                                             and not os.path.islink(output_path)):
        sys.exit(f"{output_path}: exists and is not a regular file; not replacing it")
    directory, name = os.path.split(os.path.abspath(output_path))
    descriptor, temporary = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as output:
            # mkstemp's 0600, widened to what open() would have made (0666 less the umask).
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(output.fileno(), 0o666 & ~umask)
            output.write(text)
            output.flush()
            os.fsync(output.fileno())
        os.replace(temporary, output_path)
    except BaseException:
        os.unlink(temporary)
        raise
