#!/usr/bin/env python3
"""backend/ops/*_cuda.cu files rewritten as host C++ for the warp emulation
(warp_emulator.hpp), whole: their kernels and their host side, so that a test calls the
ops' own CUDA entry points (the launch sizes and pack widths they choose included) and each
launch runs the kernel's blocks as fibers. The rewriting:
  - the project's .cuh includes (cuda_common.cuh, norm_rows_cuda.cuh) inlined once;
  - namespace backend::cuda renamed: its detail helpers to backend::cuda_emulated::detail, each
    file's own code to backend::cuda_emulated::<file> (two files' internal names may be the
    same), so that the emulated functions do not collide with the real ones of the backend
    libraries a test links for the CPU twins; backend::cuda_emulated::all nominates every
    file's namespace, and a using-directive keeps what the ops' headers declare in
    backend::cuda in reach;
  - `kernel<<<grid, block, shared, stream>>>(arguments);` becomes
    `::warp_emulator::launch_kernel(grid, block, shared, stream, [&] { kernel(arguments); });`
    (the stream goes unused: the emulation runs each launch at once);
  - a static `__shared__` array becomes `static` (a block's fibers share one thread, and the
    emulation runs one block at a time), a dynamic one (`extern __shared__ T name[];`) a
    pointer to the block's launch-sized memory; nvcc's `#pragma unroll` hints are dropped.
Fails, naming the file and what it did not expect (inline assembly, a launch it cannot parse), rather than producing code that tests something else.
Usage: extract_cuda_ops.py OUTPUT.inc FILE.cu..."""
import os
import re
import sys

from whole_file import write_whole

INLINED = ("backend/ops/cuda_common.cuh", "backend/ops/norm_rows_cuda.cuh")


def fail(path, what):
    sys.exit(f"{path}: {what}; update tests/gpu/emulation/extract_cuda_ops.py or leave this "
             "file out of the emulation")


def in_line_comment(text, position):
    line_start = text.rfind("\n", 0, position) + 1
    return "//" in text[line_start:position]


def statement_start(text, position):
    """Just after the `;`, `{` or `}` (outside a // comment) that ends the previous statement."""
    index = position - 1
    while index >= 0:
        if text[index] in ";{}" and not in_line_comment(text, index):
            return index + 1
        index -= 1
    return 0


def matching(text, open_index, opening, closing, path):
    depth = 0
    for index in range(open_index, len(text)):
        if text[index] == opening:
            depth += 1
        elif text[index] == closing:
            depth -= 1
            if depth == 0:
                return index
    fail(path, f"no '{closing}' closes the '{opening}' at offset {open_index}")


def split_top_level(text):
    parts, depth, current = [], 0, ""
    for character in text:
        if character in "(<[{":
            depth += 1
        elif character in ")>]}":
            depth -= 1
        if character == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += character
    parts.append(current.strip())
    return parts


def rewrite_launches(text, path):
    while "<<<" in text:
        launch = text.index("<<<")
        start = statement_start(text, launch)
        # The statement's leading whitespace and comment lines stay where they are.
        lead = re.match(r"(\s*(?://[^\n]*\n\s*)*)", text[start:launch]).group(1)
        callee_start = start + len(lead)
        callee = text[callee_start:launch].strip()
        if not re.fullmatch(r"[\w:]+(\s*<.*>)?", callee, flags=re.S):
            fail(path, f"a launch of '{callee}', which is no kernel name")
        configuration_end = text.index(">>>", launch)
        configuration = split_top_level(text[launch + 3:configuration_end])
        if not 2 <= len(configuration) <= 4:
            fail(path, f"the launch configuration <<<{text[launch + 3:configuration_end]}>>>")
        grid, block = configuration[0], configuration[1]
        shared = configuration[2] if len(configuration) > 2 else "0"
        stream = configuration[3] if len(configuration) > 3 else "nullptr"
        arguments_open = configuration_end + 3
        while text[arguments_open].isspace():
            arguments_open += 1
        if text[arguments_open] != "(":
            fail(path, f"no arguments after the launch of '{callee}'")
        arguments_close = matching(text, arguments_open, "(", ")", path)
        semicolon = arguments_close + 1
        while text[semicolon].isspace():
            semicolon += 1
        if text[semicolon] != ";":
            fail(path, f"the launch of '{callee}' is not a statement of its own")
        arguments = text[arguments_open:arguments_close + 1]
        replacement = (f"::warp_emulator::launch_kernel({grid}, {block}, {shared}, {stream}, [&] "
                       f"{{ {callee}{arguments}; }});")
        text = text[:callee_start] + replacement + text[semicolon + 1:]
    return text


def source_of(path, root, inlined):
    text = open(path, encoding="utf-8").read()

    def include(match):
        name = match.group(1)
        if name not in INLINED:
            return match.group(0)
        if name in inlined:
            return ""
        inlined.add(name)
        return source_of(os.path.join(root, name), root, inlined)

    text = re.sub(r'^#include "([^"]+)"\n', include, text, flags=re.M)
    return text.replace("#pragma once\n", "", 1)


def namespace_of(path):
    return os.path.basename(path).removesuffix(".cu").removesuffix("_cuda")


def rewrite(path, root, inlined):
    text = source_of(path, root, inlined)
    # Dynamic shared memory: the launch's bytes, which launch_kernel carves for each block.
    dynamic = re.compile(r"extern __shared__ (?:__align__\(\d+\) )?(\w+) (\w+)\[\];")
    text = dynamic.sub(lambda m: f"{m.group(1)}* {m.group(2)} = reinterpret_cast<{m.group(1)}*>("
                       "::warp_emulator::block->shared);", text)
    if re.search(r"\bextern\s+__shared__", text):
        fail(path, "a dynamic shared memory declaration of another shape")
    if re.search(r"\basm\b", text):
        fail(path, "inline assembly")
    # The shared helpers in one namespace; each file's own code in a namespace of its own, so
    # that two files' internal names (an anonymous namespace's kThreads) do not meet.
    stem = namespace_of(path)
    text = text.replace("backend::cuda::detail", "backend::cuda_emulated::detail")
    text = re.sub(r"\bbackend::cuda\b(?![_:])", f"backend::cuda_emulated::{stem}", text)
    if re.search(r"\bbackend::cuda::", text):
        fail(path, "a qualified name in backend::cuda other than its detail helpers")
    text = re.sub(r"^#pragma unroll[^\n]*\n", "", text, flags=re.M)
    text = re.sub(r"^(\s*)__shared__\s", r"\1static ", text, flags=re.M)
    return rewrite_launches(text, path)


def main(output_path, sources):
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
    inlined = set()
    parts = [f"// Generated from {', '.join(sources)} by extract_cuda_ops.py: do not edit.\n",
             # What the ops' headers declare in backend::cuda (constants such as
             # kReductionPartials) is found from the renamed namespace as before; its own
             # definitions come first.
             "namespace backend::cuda {}\n"
             "namespace backend::cuda_emulated {\nusing namespace ::backend::cuda;\n}\n"]
    for path in sources:
        parts.append(f"// ---- {path}\n")
        parts.append(rewrite(path, root, inlined))
    # Every file's entry points in reach through one namespace (backend::cuda_emulated::all).
    parts.append("namespace backend::cuda_emulated::all {\n")
    parts.extend(f"using namespace ::backend::cuda_emulated::{namespace_of(path)};\n"
                 for path in sources)
    parts.append("}\n")
    write_whole(output_path, "".join(parts))


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
