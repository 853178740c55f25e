// What several test processes need and only read, made once per build rather than once per
// process (CTest runs each test case as a process of its own): a directory of the build tree
// (test-cache/<name>, beside bin/) kept with a stamp of what made it, remade when the stamp
// differs, and made under a file lock so that the processes CTest runs side by side make it
// once. The stamp is written last: a making cut short leaves none, so the next process makes it
// again. The tests only read what is there: what they write goes to their own temporary
// directories.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "test_files.hpp"

namespace test_support {

struct BuildCacheEntry {
  std::filesystem::path directory;
  std::string output;  // what making it printed, or that it was reused
  bool ok = false;
};

// test-cache/`name` as `make` fills it (given the emptied directory; false and its output in
// `output` when it failed), made now unless an earlier making left the same `stamp`.
inline BuildCacheEntry made_once_per_build(
    const std::string& name, const std::string& stamp,
    const std::function<bool(const std::filesystem::path& directory, std::string& output)>& make) {
  namespace fs = std::filesystem;
  const fs::path cache = fs::path(kTestBin).parent_path() / "test-cache";
  fs::create_directories(cache);
  BuildCacheEntry entry;
  entry.directory = cache / name;
  const std::string lock_path = entry.directory.string() + ".lock";
  const int lock = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock < 0 || ::flock(lock, LOCK_EX) != 0) {
    entry.output = "cannot lock " + lock_path;
    if (lock >= 0) ::close(lock);
    return entry;
  }
  std::ifstream stamp_file(entry.directory / "stamp");
  std::stringstream kept;
  kept << stamp_file.rdbuf();
  if (stamp_file && kept.str() == stamp) {
    entry.output = "reused what was made before in " + entry.directory.string();
    entry.ok = true;
  } else {
    fs::remove_all(entry.directory);
    fs::create_directories(entry.directory);
    entry.ok = make(entry.directory, entry.output);
    if (entry.ok) std::ofstream(entry.directory / "stamp") << stamp;
  }
  ::close(lock);
  return entry;
}

}  // namespace test_support
