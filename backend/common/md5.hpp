// MD5 (RFC 1321), only as Megatron uses it: the name of a dataset's cached index files is the
// hex MD5 of the dataset's description (megatron/core/datasets/megatron_dataset.py,
// hashlib.md5(unique_description).hexdigest()). Not for anything that needs a secure hash.
#pragma once

#include <string>
#include <string_view>

namespace common {

// The 32 lowercase hex digits of MD5(bytes), as Python's hashlib.md5(...).hexdigest().
std::string md5_hex(std::string_view bytes);

}  // namespace common
