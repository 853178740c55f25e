// Checking, taking and writing a results directory; see results_dir.hpp.
#include "launcher/results_dir.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>

#include "backend/common/error.hpp"
#include "backend/common/file_lock.hpp"
#include "backend/common/local_time.hpp"

namespace launcher {

namespace fs = std::filesystem;

namespace {

// Linux's limits on one path component and on a whole path (NAME_MAX, PATH_MAX - 1).
constexpr std::size_t kMaxComponentBytes = 255;
constexpr std::size_t kMaxPathBytes = 4095;

// A user value quoted in a message: control characters (a NUL would end the message) as
// \xNN, and of a long value its start and how long it was.
std::string shortened(std::string_view text) {
  constexpr std::size_t kShown = 60;
  std::size_t cut = std::min(text.size(), kShown);
  while (cut > 0 && cut < text.size() && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) {
    --cut;  // not inside a UTF-8 sequence
  }
  std::string shown;
  for (const char character : text.substr(0, cut)) {
    const auto byte = static_cast<unsigned char>(character);
    shown += byte < 0x20 || byte == 0x7f ? fmt::format("\\x{:02x}", byte) : std::string(1, character);
  }
  return cut == text.size() ? shown : fmt::format("{}... ({} bytes)", shown, text.size());
}

std::string with_underscores_for_slashes(std::string_view name) {
  std::string text(name);
  std::replace(text.begin(), text.end(), '/', '_');
  return text;
}

}  // namespace

void check_file_name_part(std::string_view name, std::string_view key) {
  if (name.empty()) common::fail("{} is empty: it names the run's files and directory", key);
  if (name.find('/') != std::string_view::npos) {
    common::fail("{} '{}' contains '/': it becomes file names (<name>_hydra.yaml, "
                 "<name>_submission.sh), so it must be one file name; use e.g. '{}'",
                 key, shortened(name), shortened(with_underscores_for_slashes(name)));
  }
  if (name.find('\0') != std::string_view::npos) {
    common::fail("{} '{}' contains a NUL byte, which no file name can hold", key, shortened(name));
  }
  if (name == "." || name == "..") {
    common::fail("{} '{}' is not a usable file name (it means a directory)", key, name);
  }
  if (name.size() > kMaxNameBytes) {
    common::fail("{} '{}' is longer than {} bytes: file names are named after it "
                 "(log-<name>_<job id>.out) and may not be longer than {} bytes",
                 key, shortened(name), kMaxNameBytes, kMaxComponentBytes);
  }
}

void check_directory_path(const fs::path& directory, std::string_view key) {
  const std::string& text = directory.native();
  if (text.empty()) {
    common::fail("{} is empty: give the directory the run's results go to", key);
  }
  if (text.find('\0') != std::string::npos) {
    common::fail("{} '{}' contains a NUL byte, which no path can hold", key, shortened(text));
  }
  if (text.size() > kMaxPathBytes) {
    common::fail("{} '{}' is longer than {} bytes, the longest path Linux opens", key,
                 shortened(text), kMaxPathBytes);
  }
  for (const fs::path& part : directory) {
    if (part.native().size() > kMaxComponentBytes) {
      common::fail("{} '{}': the part '{}' is longer than {} bytes, the longest file name Linux "
                   "allows",
                   key, shortened(text), shortened(part.native()), kMaxComponentBytes);
    }
  }
  // The nearest existing ancestor must be a directory (base_results_dir=/etc/hosts would make
  // every write below fail).
  for (fs::path existing = directory; !existing.empty(); existing = existing.parent_path()) {
    std::error_code error;
    const fs::file_type type = fs::status(existing, error).type();
    if (type == fs::file_type::not_found) {
      if (existing == existing.parent_path()) break;
      continue;
    }
    if (type != fs::file_type::directory && type != fs::file_type::none) {
      common::fail("{} '{}': {} exists and is not a directory", key, shortened(text),
                   existing.string());
    }
    break;  // a directory, or unknown (no permission): creating it will say
  }
}

namespace {

// Every results directory defaults under base_results_dir (itself under launcher_scripts_path,
// which for an installed launcher is its share/ directory, often not the user's to write).
[[noreturn]] void fail_to_create(std::string_view key, const fs::path& directory,
                                 const std::string& reason) {
  common::fail("{}: cannot create the results directory {}: {}; set base_results_dir=DIR (where "
               "every run's results go) or {} to a directory this user can write",
               key, directory.string(), reason, key);
}

}  // namespace

void create_results_dir(const fs::path& directory, std::string_view key) {
  std::error_code error;
  fs::create_directories(directory, error);
  if (error) fail_to_create(key, directory, error.message());
}

fs::path create_unique_directory(const fs::path& wanted, std::string_view key) {
  check_directory_path(wanted, key);
  if (wanted.has_parent_path()) create_results_dir(wanted.parent_path(), key);
  for (int suffix = 0; suffix <= kMaxUniqueSuffix; ++suffix) {
    const fs::path candidate =
        suffix == 0 ? wanted : fs::path(wanted.string() + "-" + std::to_string(suffix));
    // Exclusive by the kernel: of two launchers trying one name, exactly one creates it.
    if (::mkdir(candidate.c_str(), 0777) == 0) return candidate;
    if (errno != EEXIST) fail_to_create(key, candidate, std::strerror(errno));
  }
  common::fail("{}: {} and {}-1 ... {}-{} all exist; clean up old runs there or set another "
               "base_results_dir", key, wanted.string(), wanted.string(), wanted.string(),
               kMaxUniqueSuffix);
}

ResultsDirLock::ResultsDirLock(const fs::path& directory) : path_(directory / kFileName) {
  descriptor_ = open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (descriptor_ < 0 && errno == EACCES) {
    // Another user's lock file in a shared directory: flock needs no write access; only who
    // holds it goes unrecorded.
    descriptor_ = open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    writable_ = false;
  }
  if (descriptor_ < 0) {
    common::fail("cannot open the lock file {}: {}", path_.string(), std::strerror(errno));
  }
  int status = 0;
  while ((status = flock(descriptor_, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {
  }
  if (status != 0) {
    const int error = errno;
    std::string holder;
    char buffer[512];
    const ssize_t got = pread(descriptor_, buffer, sizeof buffer - 1, 0);
    if (got > 0) holder.assign(buffer, static_cast<std::size_t>(got));
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    close(descriptor_);
    descriptor_ = -1;
    if (error != EWOULDBLOCK) {
      common::fail("cannot lock {}: {}", path_.string(), std::strerror(error));
    }
    common::fail("the results directory {} is in use by {} (it holds {}): wait until that launch "
                 "and its local job have finished, or launch this run under another name (e.g. "
                 "training.run.name=<name>) or with unique_output_dir=true",
                 directory.string(), holder.empty() ? "another launch" : holder, path_.string());
  }
  write_holder(fmt::format("launcher pid {} on host {}, since {}", getpid(), common::local_host_name(),
                           common::format_local_time(std::time(nullptr))));
}

ResultsDirLock::ResultsDirLock(ResultsDirLock&& other) noexcept
    : path_(std::move(other.path_)), descriptor_(other.descriptor_), writable_(other.writable_) {
  other.descriptor_ = -1;
}

ResultsDirLock::~ResultsDirLock() {
  if (descriptor_ >= 0) close(descriptor_);
}

void ResultsDirLock::share_with_children() {
  write_holder(fmt::format("the detached local job of launcher pid {} on host {}, since {}",
                           getpid(), common::local_host_name(), common::format_local_time(std::time(nullptr))));
  const int flags = fcntl(descriptor_, F_GETFD);
  if (flags < 0 || fcntl(descriptor_, F_SETFD, flags & ~FD_CLOEXEC) != 0) {
    common::fail("cannot hand the lock {} on to the job: {}", path_.string(), std::strerror(errno));
  }
}

void ResultsDirLock::write_holder(const std::string& holder) {
  if (!writable_) return;
  const std::string line = holder + "\n";
  if (ftruncate(descriptor_, 0) != 0 ||
      pwrite(descriptor_, line.data(), line.size(), 0) != static_cast<ssize_t>(line.size())) {
    common::fail("cannot write the lock file {}: {}", path_.string(), std::strerror(errno));
  }
}

}  // namespace launcher
