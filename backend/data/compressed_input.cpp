// Decompressing reader for preprocess_data's inputs: zlib (gzip), libzstd and liblzma (xz)
// in streaming mode, one compressed chunk at a time (see compressed_input.hpp).
#include "backend/data/compressed_input.hpp"

#include <fcntl.h>
#include <lzma.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/common/error.hpp"

namespace backend {

enum class Format { plain, gzip, zstd, xz };

namespace {

constexpr unsigned char kBzip2BlockMagic[] = {0x31, 0x41, 0x59, 0x26, 0x53, 0x59};
constexpr unsigned char kBzip2EndMagic[] = {0x17, 0x72, 0x45, 0x38, 0x50, 0x90};
constexpr std::pair<std::string_view, std::string_view> kSuffixFormats[] = {
    {".gz", "gzip"}, {".zst", "zstd"}, {".xz", "xz"}, {".bz2", "bzip2"}};

}  // namespace

struct CompressedInput::Decoder {
  std::string path;
  int fd = -1;
  Format format = Format::plain;
  std::vector<unsigned char> input;  // compressed bytes read but not yet consumed
  size_t input_start = 0, input_end = 0;
  bool input_eof = false;
  bool stream_ended = true;  // no compressed member is open
  z_stream gzip{};
  bool gzip_initialized = false;
  ZSTD_DStream* zstd = nullptr;
  lzma_stream xz = LZMA_STREAM_INIT;
  bool xz_initialized = false;

  explicit Decoder(std::string file) : path(std::move(file)), input(size_t(1) << 20) {}
  ~Decoder() {
    if (gzip_initialized) inflateEnd(&gzip);
    if (zstd != nullptr) ZSTD_freeDStream(zstd);
    if (xz_initialized) lzma_end(&xz);
    if (fd >= 0) ::close(fd);
  }

  // Refills `input` when it is empty; false at the end of the file.
  bool fill() {
    if (input_start < input_end) return true;
    if (input_eof) return false;
    ssize_t got;
    do {
      got = ::read(fd, input.data(), input.size());
    } while (got < 0 && errno == EINTR);
    if (got < 0) common::fail("cannot read {}: {}", path, std::strerror(errno));
    input_start = 0;
    input_end = static_cast<size_t>(got);
    if (got == 0) input_eof = true;
    return got > 0;
  }

  [[noreturn]] void truncated(const char* what) const {
    common::fail("{}: the {} data ends early (truncated file?)", path, what);
  }

  size_t read_plain(char* buffer, size_t capacity) {
    if (!fill()) return 0;
    const size_t n = std::min(capacity, input_end - input_start);
    std::memcpy(buffer, input.data() + input_start, n);
    input_start += n;
    return n;
  }

  // The decoders may hold output back when the caller's buffer was full, so they are called
  // even with no input left; only a call that then produces nothing means the end.
  size_t read_gzip(char* buffer, size_t capacity) {
    while (true) {
      const bool have_input = fill();
      if (stream_ended) {  // a new member starts (gzip files may be concatenations)
        if (!have_input) return 0;
        if (gzip_initialized) inflateEnd(&gzip);
        gzip = z_stream{};
        if (inflateInit2(&gzip, 16 + MAX_WBITS) != Z_OK) common::fail("{}: zlib init failed", path);
        gzip_initialized = true;
        stream_ended = false;
      }
      gzip.next_in = input.data() + input_start;
      gzip.avail_in = static_cast<uInt>(input_end - input_start);
      gzip.next_out = reinterpret_cast<Bytef*>(buffer);
      gzip.avail_out = static_cast<uInt>(capacity);
      const int status = inflate(&gzip, Z_NO_FLUSH);
      input_start = input_end - gzip.avail_in;
      if (status == Z_STREAM_END) {
        stream_ended = true;
      } else if (status != Z_OK && status != Z_BUF_ERROR) {
        common::fail("{}: corrupt gzip data ({})", path, gzip.msg != nullptr ? gzip.msg : "error");
      }
      const size_t produced = capacity - gzip.avail_out;
      if (produced > 0) return produced;
      if (!have_input && !stream_ended) truncated("gzip");
    }
  }

  size_t read_zstd(char* buffer, size_t capacity) {
    while (true) {
      const bool have_input = fill();
      if (!have_input && stream_ended) return 0;
      ZSTD_inBuffer in{input.data() + input_start, input_end - input_start, 0};
      ZSTD_outBuffer out{buffer, capacity, 0};
      const size_t status = ZSTD_decompressStream(zstd, &out, &in);
      if (ZSTD_isError(status)) {
        common::fail("{}: corrupt zstd data ({})", path, ZSTD_getErrorName(status));
      }
      input_start += in.pos;
      stream_ended = status == 0;  // 0: a frame is complete and fully flushed
      if (out.pos > 0) return out.pos;
      if (!have_input && !stream_ended) truncated("zstd");
    }
  }

  size_t read_xz(char* buffer, size_t capacity) {
    while (true) {
      const bool more = fill();
      xz.next_in = input.data() + input_start;
      xz.avail_in = input_end - input_start;
      xz.next_out = reinterpret_cast<uint8_t*>(buffer);
      xz.avail_out = capacity;
      const lzma_ret status = lzma_code(&xz, more ? LZMA_RUN : LZMA_FINISH);
      input_start = input_end - xz.avail_in;
      const size_t produced = capacity - xz.avail_out;
      if (status == LZMA_STREAM_END) return produced;
      if (status != LZMA_OK) {
        if (!more && status == LZMA_BUF_ERROR) truncated("xz");
        common::fail("{}: corrupt xz data (liblzma error {})", path, static_cast<int>(status));
      }
      if (produced > 0) return produced;
      if (!more) truncated("xz");
    }
  }
};

CompressedInput::CompressedInput(const std::string& path)
    : path_(path), decoder_(std::make_unique<Decoder>(path)) {
  Decoder& d = *decoder_;
  d.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (d.fd < 0) common::fail("cannot open --input {}: {}", path, std::strerror(errno));
  d.fill();
  const unsigned char* head = d.input.data();
  const size_t available = d.input_end;
  const auto starts_with = [&](std::initializer_list<unsigned char> magic) {
    if (available < magic.size()) return false;
    return std::equal(magic.begin(), magic.end(), head);
  };
  if (starts_with({0x1F, 0x8B})) {
    d.format = Format::gzip;
  } else if (starts_with({0x28, 0xB5, 0x2F, 0xFD})) {
    d.format = Format::zstd;
    d.zstd = ZSTD_createDStream();
    if (d.zstd == nullptr || ZSTD_isError(ZSTD_initDStream(d.zstd))) {
      common::fail("{}: zstd init failed", path);
    }
  } else if (starts_with({0xFD, 0x37, 0x7A, 0x58, 0x5A, 0x00})) {
    d.format = Format::xz;
    if (lzma_stream_decoder(&d.xz, UINT64_MAX, LZMA_CONCATENATED) != LZMA_OK) {
      common::fail("{}: xz init failed", path);
    }
    d.xz_initialized = true;
  }
  // "BZh", the block size 1-9, then a block's or the end-of-stream's magic number.
  const bool bzip2 = available >= 10 && starts_with({'B', 'Z', 'h'}) && head[3] >= '1' && head[3] <= '9' &&
                     (std::equal(head + 4, head + 10, std::begin(kBzip2BlockMagic)) ||
                      std::equal(head + 4, head + 10, std::begin(kBzip2EndMagic)));
  const std::string found = bzip2 ? "bzip2" : format();
  // A name that promises a compression the content lacks is a mistake upstream (a failed
  // download, a renamed file): reading it as what it is would hide that.
  for (const auto& [suffix, promised] : kSuffixFormats) {
    if (!path.ends_with(suffix) || found == promised) continue;
    std::string head_bytes;
    for (size_t i = 0; i < std::min<size_t>(available, 8); ++i) {
      head_bytes += fmt::format("{}{:02x}", i ? " " : "", head[i]);
    }
    common::fail("{}: named {}, but its content is not {}: it is {}", path, suffix, promised,
                 available == 0 ? std::string("empty")
                                : fmt::format("{} (it starts with {})",
                                              found == "plain" ? "plain, uncompressed" : found, head_bytes));
  }
  if (bzip2) {
    common::fail("{} is bzip2, which is not supported (gzip, zstd and xz are); decompress it first, "
                 "e.g. bunzip2 {}", path, path);
  }
}

CompressedInput::~CompressedInput() = default;

size_t CompressedInput::read(char* buffer, size_t capacity) {
  if (capacity == 0) return 0;
  switch (decoder_->format) {
    case Format::plain: return decoder_->read_plain(buffer, capacity);
    case Format::gzip: return decoder_->read_gzip(buffer, capacity);
    case Format::zstd: return decoder_->read_zstd(buffer, capacity);
    case Format::xz: return decoder_->read_xz(buffer, capacity);
  }
  return 0;
}

const char* CompressedInput::format() const {
  switch (decoder_->format) {
    case Format::plain: return "plain";
    case Format::gzip: return "gzip";
    case Format::zstd: return "zstd";
    case Format::xz: return "xz";
  }
  return "plain";
}

}  // namespace backend
