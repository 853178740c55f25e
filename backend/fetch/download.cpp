// One file over libcurl with resume, retries and verification; see download.hpp. The HTTP
// parts follow RFC 9110: §14.2 Range, §14.4 Content-Range (`bytes a-b/n`, `bytes */n` with
// 416), §15.3.7 206 Partial Content, §10.2.3 Retry-After (the delay-seconds form).
#include "backend/fetch/download.hpp"

#include <curl/curl.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "backend/common/ascii_case.hpp"
#include "backend/common/durable_file.hpp"
#include "backend/common/error.hpp"
#include "backend/common/sha256.hpp"
#include "backend/common/url_file_name.hpp"
#include "backend/common/user_file.hpp"
#include "backend/common/write_all.hpp"

namespace backend {

namespace fs = std::filesystem;

namespace {

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}


std::string trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  return std::string(text);
}

// The .part file, opened without truncation and locked against a second download into it.
// It is readable by its owner only until it is complete (the source may be private: a
// file:// URL of a 0600 file); set_mode gives it its final permissions before the rename.
class PartFile {
 public:
  PartFile(const fs::path& path, const std::string& output) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd_ < 0) common::fail("cannot open {} for writing: {}", path.string(), std::strerror(errno));
    // A .part left by an earlier run may have been created readable by all.
    ::fchmod(fd_, 0600);
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int error = errno;
      ::close(fd_);
      if (error == EWOULDBLOCK) {
        common::fail("another download into {} is running (it holds the lock on {})", output,
                     path.string());
      }
      common::fail("cannot lock {}: {}", path.string(), std::strerror(error));
    }
  }
  ~PartFile() { ::close(fd_); }
  PartFile(const PartFile&) = delete;
  PartFile& operator=(const PartFile&) = delete;

  int fd() const { return fd_; }
  int64_t size() const {
    struct stat status {};
    if (::fstat(fd_, &status) != 0) common::fail("cannot stat {}: {}", path_.string(), std::strerror(errno));
    return status.st_size;
  }
  void truncate() {
    if (::ftruncate(fd_, 0) != 0) common::fail("cannot truncate {}: {}", path_.string(), std::strerror(errno));
  }
  void set_mode(mode_t mode) {
    if (::fchmod(fd_, mode) != 0) {
      common::fail("cannot set the permissions of {}: {}", path_.string(), std::strerror(errno));
    }
  }
  void sync() {
    if (::fsync(fd_) != 0) common::fail("cannot flush {}: {}", path_.string(), std::strerror(errno));
  }
  // Feeds the first `size` bytes of the file to `hash` (the part an earlier run downloaded).
  void hash_prefix(int64_t size, common::Sha256& hash) const {
    std::vector<char> buffer(1 << 20);
    for (int64_t at = 0; at < size;) {
      const ssize_t got = ::pread(fd_, buffer.data(),
                                  static_cast<size_t>(std::min<int64_t>(size - at, buffer.size())), at);
      if (got <= 0) common::fail("cannot read {}: {}", path_.string(), got < 0 ? std::strerror(errno) : "short file");
      hash.update(buffer.data(), static_cast<size_t>(got));
      at += got;
    }
  }

 private:
  fs::path path_;
  int fd_ = -1;
};

std::string sha256_of_file(const fs::path& path) {
  const common::OpenFile file(path, "--output");
  common::Sha256 hash;
  std::vector<char> buffer(1 << 20);
  for (;;) {
    const ssize_t got = ::read(file.descriptor(), buffer.data(), buffer.size());
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) common::fail("cannot read --output {}: {}", path.string(), std::strerror(errno));
    if (got == 0) break;
    hash.update(buffer.data(), static_cast<size_t>(got));
  }
  return hash.finish_hex();
}

bool transient_http_status(long status) {
  return status == 408 || status == 425 || status == 429 || status == 500 || status == 502 ||
         status == 503 || status == 504;
}

bool transient_curl_error(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_RESOLVE_HOST:  // cluster DNS hiccups; a typo costs the backoff, not more
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_PARTIAL_FILE:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_HTTP3:
    case CURLE_QUIC_CONNECT_ERROR:
    case CURLE_FTP_ACCEPT_TIMEOUT:
    case CURLE_FTP_CANT_GET_HOST:
    case CURLE_WEIRD_SERVER_REPLY:
      return true;
    default:
      return false;
  }
}

// What one transfer (one curl_easy_perform) saw; the callbacks fill it in.
struct Transfer {
  CURL* curl = nullptr;
  PartFile* part = nullptr;
  common::Sha256* hash = nullptr;  // null: no verification
  TransferProgress* progress = nullptr;
  int64_t offset = 0;          // bytes in the .part file
  int64_t requested_from = 0;  // the range asked for (0: the whole file)
  int64_t received = 0;        // body bytes written by this transfer
  // The current response (a redirect or a 100 Continue is followed by another).
  long status = 0;
  std::string reason;
  int64_t range_start = -1, range_total = -1;
  double retry_after_seconds = -1;
  bool body_started = false;
  bool writing = false;
  std::string error_body;       // the start of an error response's body, for the message
  std::string write_error;      // a local failure that stopped the transfer
  std::string restart_note;     // set when the server ignored the range and we started over
};

void parse_content_range(std::string_view value, Transfer& transfer) {
  // bytes 100-199/200, bytes */200, bytes 100-199/*
  if (!value.starts_with("bytes")) return;
  value.remove_prefix(5);
  const std::string text = trim(value);
  const size_t slash = text.find('/');
  if (slash == std::string::npos) return;
  const std::string range = text.substr(0, slash), total = text.substr(slash + 1);
  try {
    if (range != "*") transfer.range_start = std::stoll(range.substr(0, range.find('-')));
    if (total != "*") transfer.range_total = std::stoll(total);
  } catch (const std::exception&) {
    // A malformed header is treated as absent.
  }
}

size_t on_header(char* data, size_t size, size_t count, void* user) {
  auto& transfer = *static_cast<Transfer*>(user);
  const std::string_view line(data, size * count);
  if (line.starts_with("HTTP/")) {  // a new response: forget what the previous one said
    const std::string text = trim(line);
    const size_t space = text.find(' ');
    transfer.status = space == std::string::npos ? 0 : std::atol(text.c_str() + space + 1);
    const size_t reason_at = space == std::string::npos ? std::string::npos : text.find(' ', space + 1);
    transfer.reason = reason_at == std::string::npos ? "" : text.substr(reason_at + 1);
    transfer.range_start = transfer.range_total = -1;
    transfer.retry_after_seconds = -1;
    transfer.body_started = false;
    transfer.error_body.clear();
    return line.size();
  }
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos) return line.size();
  const std::string name = common::ascii_lowercase(trim(line.substr(0, colon)));
  const std::string value = trim(line.substr(colon + 1));
  if (name == "content-range") {
    parse_content_range(value, transfer);
  } else if (name == "retry-after" && !value.empty() &&
             std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    transfer.retry_after_seconds = std::atof(value.c_str());
  }
  return line.size();
}

bool is_http(CURL* curl) {
  const char* scheme = nullptr;
  curl_easy_getinfo(curl, CURLINFO_SCHEME, &scheme);
  const std::string name = scheme ? common::ascii_lowercase(scheme) : "";
  return name == "http" || name == "https";
}

// Decides, at the first body byte of a response, whether the body is the file.
void begin_body(Transfer& transfer) {
  transfer.body_started = true;
  transfer.writing = false;
  if (is_http(transfer.curl)) {
    long status = 0;
    curl_easy_getinfo(transfer.curl, CURLINFO_RESPONSE_CODE, &status);
    transfer.status = status;
    if (status == 206) {
      if (transfer.range_start >= 0 && transfer.range_start != transfer.requested_from) {
        transfer.write_error = fmt::format("the server sent bytes from {} when asked for bytes from {}",
                                           transfer.range_start, transfer.requested_from);
        return;
      }
      transfer.writing = true;
    } else if (status == 200) {
      if (transfer.offset > 0) {  // the range was ignored: the whole file comes again
        transfer.part->truncate();
        transfer.offset = 0;
        if (transfer.hash) transfer.hash->reset();
        transfer.restart_note = "the server ignored the range request (200, not 206): starting over";
      }
      transfer.writing = true;
    }
  } else {
    transfer.writing = true;  // file://, ftp://: the body is the file
  }
  if (transfer.writing) {
    curl_off_t length = -1;
    curl_easy_getinfo(transfer.curl, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length);
    if (transfer.range_total >= 0) {
      transfer.progress->set_total(transfer.range_total);
    } else if (length >= 0) {
      transfer.progress->set_total(transfer.offset + length);
    }
  }
}

size_t on_body(char* data, size_t size, size_t count, void* user) {
  auto& transfer = *static_cast<Transfer*>(user);
  const size_t bytes = size * count;
  if (!transfer.body_started) begin_body(transfer);
  if (!transfer.write_error.empty()) return 0;
  if (!transfer.writing) {  // an error page: keep its start for the message
    transfer.error_body.append(data, std::min(bytes, size_t(300) - std::min<size_t>(300, transfer.error_body.size())));
    return bytes;
  }
  if (const int error = common::write_all(transfer.part->fd(), data, bytes, transfer.offset); error != 0) {
    transfer.write_error = std::strerror(error);
    return 0;
  }
  if (transfer.hash) transfer.hash->update(data, bytes);
  transfer.offset += static_cast<int64_t>(bytes);
  transfer.received += static_cast<int64_t>(bytes);
  transfer.progress->update(transfer.offset, steady_seconds());
  return bytes;
}

int on_transfer_info(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto& transfer = *static_cast<Transfer*>(user);
  transfer.progress->update(transfer.offset, steady_seconds());  // keeps the rate honest in a stall
  return 0;
}

// The first line of an error page, if it says something short and printable.
std::string error_page_summary(const std::string& body) {
  std::string line = trim(body.substr(0, body.find('\n')));
  if (line.empty() || line.size() > 200 || line.front() == '<') return {};
  for (char c : line) {
    if (static_cast<unsigned char>(c) < 0x20) return {};
  }
  return line;
}

using common::kMaxFileNameBytes;

std::string abbreviated(std::string_view text) {
  constexpr size_t kShown = 80;
  if (text.size() <= 2 * kShown) return std::string(text);
  return fmt::format("{}...({} bytes)", text.substr(0, kShown), text.size());
}

void check_file_name_length(const fs::path& output, const std::string& url) {
  const std::string name = output.filename().string();
  if (name.size() > kMaxFileNameBytes) {
    common::fail("download {}: --output {}: the file name is {} bytes, more than the {} bytes a "
                 "file name may have; give --output a shorter name", abbreviated(url),
                 abbreviated(output.string()), name.size(), kMaxFileNameBytes);
  }
}

// The result of one attempt, as the retry loop needs it.
enum class Outcome { kComplete, kRetry, kRestart };

struct CurlGlobal {
  CurlGlobal() {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) common::fail("libcurl failed to initialize");
  }
  ~CurlGlobal() { curl_global_cleanup(); }
};

DownloadResult download_into(const DownloadOptions& options, const fs::path& output, mode_t mode,
                             const std::string& expected, PartFile& part, const fs::path& part_path,
                             TransferProgress& progress, DownloadResult result);

// A file:// source must be a regular file: libcurl "downloads" a directory as zero bytes and a
// device or a pipe as whatever it yields, never the file that was meant. A missing one is left
// to libcurl's own error (curl error 37). Returns a file:// source's permission bits, which its
// copy keeps (as cp does: less the umask), so that a private file does not become readable by
// all; nullopt for other schemes.
std::optional<mode_t> check_file_source(const std::string& url) {
  CURLU* parsed = curl_url();
  if (parsed == nullptr) common::fail("download {}: libcurl could not parse the URL", url);
  char* scheme = nullptr;
  char* path = nullptr;
  std::string problem;
  std::optional<mode_t> source_mode;
  if (curl_url_set(parsed, CURLUPART_URL, url.c_str(), 0) == CURLUE_OK &&
      curl_url_get(parsed, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK && common::ascii_lowercase(scheme) == "file" &&
      curl_url_get(parsed, CURLUPART_PATH, &path, CURLU_URLDECODE) == CURLUE_OK) {
    struct stat status {};
    if (::stat(path, &status) == 0) {
      if (!S_ISREG(status.st_mode)) {
        problem = fmt::format("{} is not a regular file (it is a {}); give the URL of a file", path,
                              S_ISDIR(status.st_mode) ? "directory" : "device, pipe or socket");
      }
      source_mode = status.st_mode & 0777;
    }
  }
  curl_free(scheme);
  curl_free(path);
  curl_url_cleanup(parsed);
  if (!problem.empty()) common::fail("download {}: {}", url, problem);
  return source_mode;
}

// The permissions a finished download gets: a file:// source's bits, else a new file's
// (0666), less the umask either way.
mode_t final_mode(std::optional<mode_t> source_mode) {
  const mode_t mask = ::umask(0);
  ::umask(mask);
  return source_mode.value_or(0666) & ~mask & 0777;
}

}  // namespace

fs::path partial_download_path(const fs::path& output) {
  constexpr std::string_view kSuffix = ".part";
  const std::string name = output.filename().string();
  if (name.size() + kSuffix.size() <= kMaxFileNameBytes) return fs::path(output.string() + ".part");
  // A name too long to take the suffix keeps its first bytes and a digest of the whole name,
  // so two long names with one beginning never share (and resume) each other's .part.
  const std::string digest = common::sha256_hex(name).substr(0, 16);
  const size_t kept = kMaxFileNameBytes - kSuffix.size() - digest.size() - 1;
  return output.parent_path() / (name.substr(0, kept) + "-" + digest + std::string(kSuffix));
}

DownloadResult download(const DownloadOptions& options, TransferProgress& progress) {
  if (options.url.empty()) common::fail("download: no URL given");
  if (options.output.empty()) common::fail("download {}: no output file given", options.url);
  const std::string expected = common::ascii_lowercase(options.sha256);
  if (!expected.empty() && !common::is_sha256_hex(expected)) {
    common::fail("download {}: --sha256 '{}' is not a SHA-256 digest (64 hexadecimal digits)",
                 options.url, options.sha256);
  }
  if (options.retries < 0) common::fail("download {}: --retries must be at least 0, got {}", options.url, options.retries);
  if (options.retry_delay_seconds < 0 || options.max_retry_delay_seconds < 0) {
    common::fail("download {}: retry delays must not be negative", options.url);
  }
  if (options.stall_timeout_seconds <= 0 || options.connect_timeout_seconds <= 0) {
    common::fail("download {}: timeouts must be positive", options.url);
  }
  const mode_t mode = final_mode(check_file_source(options.url));

  DownloadResult result;
  if (options.output.filename().empty()) {
    common::fail("download {}: --output {} names a directory, not a file to write; add the file "
                 "name", options.url, options.output.string());
  }
  check_file_name_length(options.output, options.url);
  // Only a regular file (or a link to one, whose target is replaced) is a finished download:
  // a directory, a device or a pipe is a mistaken --output (common::output_target's rule).
  const fs::path output = [&] {
    try {
      return common::replaceable_output_file(options.output, "--output");
    } catch (const common::Error& error) {
      common::fail("download {}: {}", options.url, error.what());
    }
  }();
  std::error_code size_error;
  const uintmax_t existing_size = fs::file_size(output, size_error);
  if (!options.force && !size_error) {
    result.already_there = true;
    result.bytes = static_cast<int64_t>(existing_size);
    if (!expected.empty()) {
      result.sha256 = sha256_of_file(output);
      if (result.sha256 != expected) {
        common::fail("{} already exists, but its sha256 is {}, not the expected {} (for {}): delete "
                     "it, or pass --force, to download it again", output.string(), result.sha256,
                     expected, options.url);
      }
      progress.note(fmt::format("{} is already there ({}, sha256 verified)", output.string(),
                                format_bytes(result.bytes)));
    } else {
      progress.note(fmt::format("{} is already there ({}); not downloading it again",
                                output.string(), format_bytes(result.bytes)));
    }
    return result;
  }
  if (output.has_parent_path()) {
    std::error_code error;
    fs::create_directories(output.parent_path(), error);
    if (error) {
      common::fail("download {}: cannot create the directory {} of --output {}: {}", options.url,
                   output.parent_path().string(), options.output.string(), error.message());
    }
  }
  const fs::path part_path = partial_download_path(output);
  PartFile part(part_path, output.string());
  try {
    return download_into(options, output, mode, expected, part, part_path, progress, result);
  } catch (...) {
    // A failure before the first byte leaves no empty .part behind; bytes are kept to resume.
    std::error_code ignored;
    if (fs::exists(part_path, ignored) && part.size() == 0) fs::remove(part_path, ignored);
    throw;
  }
}

namespace {

DownloadResult download_into(const DownloadOptions& options, const fs::path& output, mode_t mode,
                             const std::string& expected, PartFile& part, const fs::path& part_path,
                             TransferProgress& progress, DownloadResult result) {
  common::Sha256 hash;
  common::Sha256* verifying = expected.empty() ? nullptr : &hash;

  int64_t offset = part.size();
  result.resumed_from = offset;
  bool restarted_from_zero = offset == 0;  // a mismatch is then final
  if (offset > 0) {
    if (verifying) part.hash_prefix(offset, hash);
    progress.note(fmt::format("resuming {} at {} from {}", part_path.string(), format_bytes(offset),
                              options.url));
  } else {
    progress.note(fmt::format("downloading {} to {}", options.url, output.string()));
  }

  CurlGlobal curl_global;
  std::mt19937 jitter_source(std::random_device{}());
  int failures_without_progress = 0;
  bool range_restart_used = false;
  for (;;) {
    ++result.attempts;
    CURL* curl = curl_easy_init();
    if (curl == nullptr) common::fail("download {}: libcurl could not create a handle", options.url);
    Transfer transfer;
    transfer.curl = curl;
    transfer.part = &part;
    transfer.hash = verifying;
    transfer.progress = &progress;
    transfer.offset = offset;
    transfer.requested_from = offset;
    char error_detail[CURL_ERROR_SIZE] = {};
    curl_easy_setopt(curl, CURLOPT_URL, options.url.c_str());
    curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https,ftp,ftps,file");
    curl_easy_setopt(curl, CURLOPT_REDIR_PROTOCOLS_STR, "http,https,ftp,ftps");  // never into file://
    curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(curl, CURLOPT_MAXREDIRS, 20L);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_USERAGENT, "megatron-native-download/" PROJECT_VERSION_STRING);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, static_cast<long>(options.connect_timeout_seconds));
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, static_cast<long>(options.stall_timeout_seconds));
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error_detail);
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, &transfer);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &transfer);
    curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, on_transfer_info);
    curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &transfer);
    curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
    if (offset > 0) curl_easy_setopt(curl, CURLOPT_RESUME_FROM_LARGE, static_cast<curl_off_t>(offset));
    progress.start(offset, -1, steady_seconds());
    const CURLcode code = curl_easy_perform(curl);
    long status = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    const bool http = is_http(curl);
    curl_easy_cleanup(curl);
    offset = transfer.offset;
    if (!transfer.restart_note.empty()) {
      progress.note(transfer.restart_note);
      restarted_from_zero = true;
    }
    if (!transfer.write_error.empty()) {
      common::fail("download {}: cannot write {}: {}", options.url, part_path.string(), transfer.write_error);
    }

    // What happened, and whether to try again.
    Outcome outcome = Outcome::kRetry;
    std::string problem;
    if (code == CURLE_OK && (!http || status == 200 || status == 206)) {
      outcome = Outcome::kComplete;
    } else if (code == CURLE_OK && status == 416 && offset > 0) {
      if (transfer.range_total == offset) {
        outcome = Outcome::kComplete;  // the .part already held the whole file
      } else {
        outcome = Outcome::kRestart;
        problem = fmt::format("the server cannot serve bytes from {} (416; the file has {} bytes)", offset,
                              transfer.range_total >= 0 ? std::to_string(transfer.range_total) : "an unknown number of");
      }
    } else if (code == CURLE_OK) {
      const std::string page = error_page_summary(transfer.error_body);
      problem = fmt::format("HTTP {}{}{}", status, transfer.reason.empty() ? "" : " " + transfer.reason,
                            page.empty() ? "" : " (" + page + ")");
      if (!transient_http_status(status)) common::fail("download {}: {}", options.url, problem);
    } else if ((code == CURLE_BAD_DOWNLOAD_RESUME || code == CURLE_RANGE_ERROR) && offset > 0) {
      // libcurl itself refuses a 200 answer to a range request (the server ignored the range).
      outcome = Outcome::kRestart;
      problem = fmt::format("{} at byte {} (curl error {}: {})",
                            code == CURLE_RANGE_ERROR ? "the server ignored the range request"
                                                      : "cannot resume", offset,
                            static_cast<int>(code), curl_easy_strerror(code));
    } else {
      problem = fmt::format("curl error {} ({}){}", static_cast<int>(code), curl_easy_strerror(code),
                            error_detail[0] ? std::string(": ") + error_detail : "");
      if (http && status >= 400) problem += fmt::format(" after HTTP {}", status);
      if (!transient_curl_error(code)) common::fail("download {}: {}", options.url, problem);
    }

    if (outcome == Outcome::kRestart) {
      if (range_restart_used) common::fail("download {}: {}", options.url, problem);
      range_restart_used = true;
      progress.note(fmt::format("{}: starting over from byte 0", problem));
      part.truncate();
      offset = 0;
      restarted_from_zero = true;
      if (verifying) hash.reset();
      continue;
    }
    if (outcome == Outcome::kComplete) {
      part.sync();
      progress.finish(offset, steady_seconds());
      if (verifying) {
        result.sha256 = hash.finish_hex();
        if (result.sha256 != expected) {
          if (!restarted_from_zero) {
            // The kept .part may be the start of an older version of the file.
            progress.note(fmt::format("sha256 {} does not match the expected {} after resuming an "
                                      "earlier partial download: downloading it again from the start",
                                      result.sha256, expected));
            part.truncate();
            offset = 0;
            restarted_from_zero = true;
            hash.reset();
            continue;
          }
          std::error_code ignored;
          fs::remove(part_path, ignored);
          common::fail("download {}: sha256 of the downloaded file is {}, expected {}; {} was not "
                       "written (and {} was removed)", options.url, result.sha256, expected,
                       output.string(), part_path.string());
        }
        progress.note(fmt::format("sha256 {} verified", result.sha256));
      }
      part.set_mode(mode);
      std::error_code error;
      fs::rename(part_path, output, error);
      if (error) {
        common::fail("download {}: cannot rename {} to {}: {}", options.url, part_path.string(),
                     output.string(), error.message());
      }
      result.bytes = offset;
      progress.note(fmt::format("saved {} ({})", output.string(), format_bytes(offset)));
      return result;
    }

    // A transient failure: back off and try again, unless it keeps failing without progress.
    failures_without_progress = transfer.received > 0 ? 1 : failures_without_progress + 1;
    if (failures_without_progress > options.retries) {
      common::fail("download {}: {}; gave up after {} attempt{} without progress", options.url,
                   problem, failures_without_progress, failures_without_progress == 1 ? "" : "s");
    }
    double delay = std::min(options.max_retry_delay_seconds,
                            options.retry_delay_seconds * std::pow(2.0, failures_without_progress - 1));
    delay += std::uniform_real_distribution<double>(0.0, 0.25 * delay)(jitter_source);
    // The server's Retry-After lengthens the wait, up to max_retry_delay.
    delay = std::max(delay, std::min(transfer.retry_after_seconds, options.max_retry_delay_seconds));
    progress.note(fmt::format("{}{}; retrying in {:.1f} s (attempt {} of {})", problem,
                              transfer.received > 0 ? fmt::format(" after {}", format_bytes(offset)) : "",
                              delay, failures_without_progress + 1, options.retries + 1));
    std::this_thread::sleep_for(std::chrono::duration<double>(delay));
  }
}

}  // namespace

}  // namespace backend
