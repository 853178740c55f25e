// Downloading one file with libcurl, robustly enough for multi-gigabyte corpora on cluster
// nodes: http(s)://, ftp(s):// and file:// (a local file, copied the same way) URLs.
//  - Into `<output>.part`, renamed to `<output>` only when complete and verified, so the final
//    name never holds a partial or corrupt file. The .part file is locked (flock) while a
//    download runs: a second download into the same file is refused, not interleaved. A name
//    too long to take ".part" within 255 bytes keeps its first bytes and 16 hex digits of its
//    SHA-256 instead. The .part is 0600 until complete; the file then gets a file:// source's
//    permission bits, or 0666, less the umask either way (as cp and curl -o do).
//  - `<output>` follows common::output_target's rule: a symbolic link to a regular file has
//    its target replaced (the .part beside the target); a directory, device, FIFO, socket,
//    dangling or looping link, or this process's standard output is refused, as is a file
//    name over 255 bytes.
//  - Resume: a `.part` left by an interrupted run (or by a dropped connection within this run)
//    is continued with a range request (`Range: bytes=N-`). A server that ignores the range
//    (200 instead of 206) makes the file start over; 416 with `Content-Range: bytes */N` where
//    N is the size on disk means the .part was already complete.
//  - Retries with exponential backoff: delay = retry_delay · 2^(k−1), capped at
//    max_retry_delay, plus up to 25 % random jitter (the tasks of a job array that all hit the
//    same 503 do not come back in lockstep); a `Retry-After: <seconds>` header lengthens it.
//    k counts consecutive attempts that made no progress: an attempt that received bytes
//    resets it, so a long download over a flaky link is not given up after `retries` drops.
//    Retried: connection failures, timeouts, cut transfers, and HTTP 408, 425, 429, 500,
//    502, 503, 504. Not retried: other HTTP errors (404, 403, ...), unreadable file:// sources,
//    bad URLs, local write errors. Stalls (no byte for stall_timeout seconds) abort the attempt.
//  - Checksum: with `sha256`, the file is hashed as it is written (the resumed part first) and
//    must match; a mismatch after resuming an older .part starts over once from byte 0 (the
//    source may have changed since), otherwise the .part is deleted and the error names both
//    digests. `<output>` is never written with data that failed verification.
//  - An existing `<output>` is kept (reported as already there) unless `force`; with `sha256`
//    it is verified first, and a mismatch is an error rather than a silent overwrite.
// Errors are common::Error naming the URL and the HTTP status (with its reason phrase) or the
// curl error (code, curl's text and detail).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "backend/fetch/transfer_progress.hpp"

namespace backend {

struct DownloadOptions {
  std::string url;
  std::filesystem::path output;
  std::string sha256;                    // expected digest, hex; empty: not verified
  int retries = 5;                       // attempts after the first, counted without progress
  double retry_delay_seconds = 1.0;      // the first backoff
  double max_retry_delay_seconds = 60.0;
  int stall_timeout_seconds = 60;        // no byte for this long: the attempt is abandoned
  int connect_timeout_seconds = 30;
  bool force = false;                    // download even when `output` exists
};

struct DownloadResult {
  bool already_there = false;  // `output` existed and was kept
  int64_t bytes = 0;           // size of `output`
  int64_t resumed_from = 0;    // bytes of an earlier .part that were kept
  int attempts = 0;            // transfers started
  std::string sha256;          // of `output`, when verification was asked for
};

// `<output>.part`, where a download collects its bytes.
std::filesystem::path partial_download_path(const std::filesystem::path& output);

DownloadResult download(const DownloadOptions& options, TransferProgress& progress);

}  // namespace backend
