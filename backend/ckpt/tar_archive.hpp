// Tar archives, read and written, for NeMo's .nemo files (nemo/core/connectors/
// save_restore_connector.py: Python's tarfile, "w:" when saving, "r:" or "r:gz" when
// restoring). The format is POSIX ustar (IEEE Std 1003.1-2001, "pax Interchange Format"): each
// member is a 512-byte header (name[100] at 0, mode at 100, size[12] octal at 124, mtime at 136,
// checksum[8] at 148, typeflag at 156, linkname at 157, "ustar\0" "00" at 257, prefix[155] at
// 345) followed by its data padded to 512 bytes; two zero blocks end the archive.
//
// Read: regular files ('0' or NUL), directories ('5'), pax extended headers ('x': the next
// member's "path" and "size" records; 'g': global, ignored) and GNU long names ('L'), the
// numbers in octal or GNU's base-256; a gzip-compressed archive is decompressed first (to
// memory). Refused, naming the archive and the member: a bad header checksum, a size running
// past the end, a link or device member, a name that is absolute or climbs out with "..", the
// same name twice. Members are named without a leading "./" (NeMo's tarfile.add(dir, arcname=
// ".") writes "./model_config.yaml").
//
// Written: ustar headers (names up to 100 bytes, or split at a '/' into prefix and name),
// members "./NAME" as NeMo's are, mode 0644, mtime 0, uid/gid 0; the file is written under a
// temporary name, fsynced and renamed into place (durable_file.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace common {
class MappedFile;
}

namespace backend {

class TarArchive {
 public:
  explicit TarArchive(const std::filesystem::path& path);
  ~TarArchive();
  TarArchive(TarArchive&&) noexcept;
  TarArchive& operator=(TarArchive&&) noexcept;

  const std::string& source() const { return source_; }
  // The regular members' names, in the archive's order.
  const std::vector<std::string>& names() const { return names_; }
  // A member's bytes (valid while the archive lives); nullptr-data span when absent: has()
  // tells.
  bool has(std::string_view name) const;
  std::span<const std::byte> member(std::string_view name) const;

 private:
  void read_members();

  std::string source_;
  std::unique_ptr<common::MappedFile> mapped_;
  std::vector<std::byte> decompressed_;
  std::span<const std::byte> bytes_;
  std::vector<std::string> names_;
  std::map<std::string, std::span<const std::byte>, std::less<>> members_;
};

// One member to write: its name (without "./") and its bytes.
struct TarMember {
  std::string name;
  std::span<const std::byte> data;
};

// Writes `members` as a tar archive at `path` (created or replaced whole, fsynced). Errors name
// the file; a name of more than 255 bytes, or one that cannot be split into ustar's prefix and
// name, is an internal error (the callers' names are short).
void write_tar_archive(const std::filesystem::path& path, std::span<const TarMember> members);

}  // namespace backend
