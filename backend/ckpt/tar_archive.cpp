// Tar archives read and written (the header says which members and numbers, after POSIX
// ustar and pax, and Python's tarfile as NeMo uses it).
#include "backend/ckpt/tar_archive.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>
#include <utility>

#include "backend/common/durable_file.hpp"
#include "backend/common/error.hpp"
#include "backend/common/user_file.hpp"
#include "backend/data/compressed_input.hpp"

namespace backend {

namespace {

constexpr size_t kBlock = 512;

// A header field as text: up to its first NUL.
std::string_view field(std::span<const std::byte> header, size_t offset, size_t length) {
  const auto* first = reinterpret_cast<const char*>(header.data() + offset);
  return {first, strnlen(first, length)};
}

// A numeric field: octal digits (spaces and NULs around them), or GNU's base-256 (the first
// byte's high bit set); nullopt when it is neither.
std::optional<uint64_t> number(std::span<const std::byte> header, size_t offset, size_t length) {
  const auto first = static_cast<uint8_t>(header[offset]);
  if ((first & 0x80u) != 0) {
    if ((first & 0x40u) != 0) return std::nullopt;  // negative
    uint64_t value = first & 0x3Fu;
    for (size_t i = 1; i < length; ++i) {
      if (value > (UINT64_MAX >> 8)) return std::nullopt;
      value = (value << 8) | static_cast<uint8_t>(header[offset + i]);
    }
    return value;
  }
  uint64_t value = 0;
  bool digits = false;
  for (size_t i = 0; i < length; ++i) {
    const auto c = static_cast<char>(header[offset + i]);
    if (c == ' ' || c == '\0') {
      if (digits) break;
      continue;
    }
    if (c < '0' || c > '7' || value > (UINT64_MAX >> 3)) return std::nullopt;
    value = value * 8 + static_cast<uint64_t>(c - '0');
    digits = true;
  }
  return value;
}

// The header's checksum: its bytes summed with the checksum field taken as spaces.
uint64_t checksum(std::span<const std::byte> header) {
  uint64_t sum = 0;
  for (size_t i = 0; i < kBlock; ++i) {
    sum += (i >= 148 && i < 156) ? uint64_t{' '} : static_cast<uint8_t>(header[i]);
  }
  return sum;
}

// A pax extended header's records: "LENGTH KEY=VALUE\n" each; the path and size ones.
struct PaxRecords {
  std::optional<std::string> path;
  std::optional<uint64_t> size;
};

PaxRecords pax_records(std::string_view data, const std::string& source) {
  PaxRecords records;
  while (!data.empty()) {
    const size_t space = data.find(' ');
    size_t length = 0;
    const bool parsed = space != std::string_view::npos && space > 0 &&
                        std::all_of(data.begin(), data.begin() + static_cast<std::ptrdiff_t>(space),
                                    [](char c) { return c >= '0' && c <= '9'; }) &&
                        space < 20;
    if (parsed) length = std::stoull(std::string(data.substr(0, space)));
    if (!parsed || length <= space + 1 || length > data.size() || data[length - 1] != '\n') {
      common::fail("{}: a pax extended header has a malformed record", source);
    }
    const std::string_view record = data.substr(space + 1, length - space - 2);
    const size_t equals = record.find('=');
    if (equals == std::string_view::npos) {
      common::fail("{}: a pax extended header has a record without '='", source);
    }
    const std::string_view key = record.substr(0, equals);
    const std::string_view value = record.substr(equals + 1);
    if (key == "path") records.path = std::string(value);
    if (key == "size") {
      if (value.empty() || value.size() > 19 ||
          !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        common::fail("{}: a pax extended header's size '{}' is not a number", source, value);
      }
      records.size = std::stoull(std::string(value));
    }
    data.remove_prefix(length);
  }
  return records;
}

// A member's name as this reader keeps it: without "./" and trailing '/'; refused when
// absolute or climbing out of the archive.
std::string member_name(std::string name, const std::string& source) {
  while (name.starts_with("./")) name.erase(0, 2);
  while (!name.empty() && name.back() == '/') name.pop_back();
  if (name.starts_with('/')) {
    common::fail("{}: member '{}' has an absolute name", source, name);
  }
  for (size_t start = 0; start <= name.size();) {
    const size_t end = std::min(name.find('/', start), name.size());
    if (name.substr(start, end - start) == "..") {
      common::fail("{}: member '{}' climbs out of the archive with '..'", source, name);
    }
    start = end + 1;
  }
  return name;
}

}  // namespace

TarArchive::TarArchive(const std::filesystem::path& path) : source_(path.string()) {
  {
    CompressedInput input(path.string());
    if (std::string_view(input.format()) != "plain") {
      // tarfile's "r:gz" (and the other compressions CompressedInput knows): read whole.
      std::array<char, 1 << 16> chunk{};
      while (const size_t got = input.read(chunk.data(), chunk.size())) {
        const auto* first = reinterpret_cast<const std::byte*>(chunk.data());
        decompressed_.insert(decompressed_.end(), first, first + got);
      }
      bytes_ = decompressed_;
    }
  }
  if (decompressed_.empty()) {
    mapped_ = std::make_unique<common::MappedFile>(path, "archive");
    bytes_ = mapped_->bytes();
  }
  read_members();
}

TarArchive::~TarArchive() = default;
TarArchive::TarArchive(TarArchive&&) noexcept = default;
TarArchive& TarArchive::operator=(TarArchive&&) noexcept = default;

void TarArchive::read_members() {
  size_t at = 0;
  std::optional<std::string> long_name;
  PaxRecords pax;
  bool ended = false;
  while (at + kBlock <= bytes_.size()) {
    const std::span<const std::byte> header = bytes_.subspan(at, kBlock);
    if (std::all_of(header.begin(), header.end(), [](std::byte b) { return b == std::byte{0}; })) {
      ended = true;
      break;
    }
    const std::optional<uint64_t> stored_sum = number(header, 148, 8);
    if (!stored_sum || *stored_sum != checksum(header)) {
      common::fail(
          "{}: the header at byte {} has a bad checksum: not a tar archive, or a "
          "damaged one",
          source_, at);
    }
    const std::optional<uint64_t> header_size = number(header, 124, 12);
    if (!header_size) common::fail("{}: the header at byte {} has a bad size", source_, at);
    const char type = static_cast<char>(header[156]);
    const uint64_t size =
        (type != 'x' && type != 'g' && type != 'L' && pax.size) ? *pax.size : *header_size;
    const size_t data_at = at + kBlock;
    if (size > bytes_.size() - data_at) {
      common::fail("{}: the member at byte {} claims {} bytes, past the archive's end", source_, at,
                   size);
    }
    const std::span<const std::byte> data = bytes_.subspan(data_at, size);
    const std::string_view text(reinterpret_cast<const char*>(data.data()), data.size());
    std::string name;
    if (long_name) {
      name = *long_name;
    } else if (pax.path) {
      name = *pax.path;
    } else {
      const std::string_view prefix = field(header, 345, 155);
      const std::string_view magic = field(header, 257, 6);
      name = (magic == "ustar" && !prefix.empty())
                 ? fmt::format("{}/{}", prefix, field(header, 0, 100))
                 : std::string(field(header, 0, 100));
    }
    at = data_at + (size + kBlock - 1) / kBlock * kBlock;
    switch (type) {
      case 'x':
        pax = pax_records(text, source_);
        continue;
      case 'g':
        continue;
      case 'L':
        long_name = std::string(text.substr(0, strnlen(text.data(), text.size())));
        continue;
      case '0':
      case '\0':
      case '7': {  // contiguous file: a regular one
        const std::string kept = member_name(name, source_);
        if (members_.count(kept) != 0) {
          common::fail("{}: member '{}' is in the archive twice", source_, kept);
        }
        members_.emplace(kept, data);
        names_.push_back(kept);
        break;
      }
      case '5':
        member_name(name, source_);
        break;
      default:
        common::fail("{}: member '{}' is a {} (type '{}'), not a regular file or directory",
                     source_, name,
                     type == '1'   ? "hard link"
                     : type == '2' ? "symbolic link"
                                   : "special file",
                     type);
    }
    long_name.reset();
    pax = {};
  }
  if (!ended && at != bytes_.size()) {
    common::fail("{}: it ends inside a member's header: a truncated archive", source_);
  }
}

bool TarArchive::has(std::string_view name) const {
  return members_.find(name) != members_.end();
}

std::span<const std::byte> TarArchive::member(std::string_view name) const {
  const auto found = members_.find(name);
  if (found == members_.end()) common::fail("{} has no member '{}'", source_, name);
  return found->second;
}

namespace {

// A ustar header for `name` of `size` bytes (`type` '0' or '5').
std::array<std::byte, kBlock> ustar_header(const std::string& name, uint64_t size, char type) {
  std::array<std::byte, kBlock> header{};
  auto put = [&](size_t offset, std::string_view text) {
    if (!text.empty()) std::memcpy(header.data() + offset, text.data(), text.size());
  };
  std::string_view stem = name, prefix;
  if (name.size() > 100) {
    const size_t slash = name.rfind('/', 155);
    if (slash == std::string::npos || name.size() - slash - 1 > 100) {
      common::fail("internal error: tar member name '{}' does not fit a ustar header", name);
    }
    prefix = std::string_view(name).substr(0, slash);
    stem = std::string_view(name).substr(slash + 1);
  }
  put(0, stem);
  put(100, type == '5' ? "0000755" : "0000644");
  put(108, "0000000");
  put(116, "0000000");
  put(124, fmt::format("{:011o}", size));
  put(136, "00000000000");
  header[156] = static_cast<std::byte>(type);
  put(257, "ustar");
  put(263, "00");
  put(345, prefix);
  put(148, fmt::format("{:06o}", checksum(header)));
  header[154] = std::byte{0};
  header[155] = static_cast<std::byte>(' ');
  return header;
}

}  // namespace

void write_tar_archive(const std::filesystem::path& path, std::span<const TarMember> members) {
  const std::filesystem::path target = common::replaceable_output_file(path, "archive");
  common::DurableFileWriter writer = common::DurableFileWriter::temporary_for(target);
  const std::filesystem::path temporary = writer.path();
  try {
    writer.write(ustar_header("./", 0, '5'));
    for (const TarMember& member : members) {
      writer.write(ustar_header("./" + member.name, member.data.size(), '0'));
      writer.write(member.data);
      writer.write_zeros((kBlock - member.data.size() % kBlock) % kBlock);
    }
    writer.write_zeros(2 * kBlock);
    writer.finish();
    common::rename_path(temporary, target);
  } catch (const common::Error& error) {
    std::error_code ignored;
    std::filesystem::remove(temporary, ignored);
    common::fail("cannot write {}: {}", target.string(), error.what());
  }
  common::fsync_directory(target.parent_path().empty() ? std::filesystem::path(".")
                                                       : target.parent_path());
}

}  // namespace backend
