// Test support: gzip, zstd and xz streams made with the libraries' own encoders, so the readers
// (CompressedInput, preprocess_data's inputs) are checked against data they did not write.
#pragma once

#include <doctest/doctest.h>

#include <lzma.h>
#include <zlib.h>
#include <zstd.h>

#include <cstdint>
#include <string>

namespace test_support {

// One gzip member (zlib's deflate with the gzip wrapper, level 9).
inline std::string gzip(const std::string& text) {
  z_stream stream{};
  REQUIRE(deflateInit2(&stream, 9, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  std::string out(deflateBound(&stream, text.size()) + 64, '\0');
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  stream.avail_in = static_cast<uInt>(text.size());
  stream.next_out = reinterpret_cast<Bytef*>(out.data());
  stream.avail_out = static_cast<uInt>(out.size());
  REQUIRE(deflate(&stream, Z_FINISH) == Z_STREAM_END);
  out.resize(stream.total_out);
  deflateEnd(&stream);
  return out;
}

// One zstd frame (level 19).
inline std::string zstd(const std::string& text) {
  std::string out(ZSTD_compressBound(text.size()), '\0');
  const size_t size = ZSTD_compress(out.data(), out.size(), text.data(), text.size(), 19);
  REQUIRE(!ZSTD_isError(size));
  out.resize(size);
  return out;
}

// One xz stream (preset 6, CRC-64 check).
inline std::string xz(const std::string& text) {
  std::string out(lzma_stream_buffer_bound(text.size()), '\0');
  size_t position = 0;
  REQUIRE(lzma_easy_buffer_encode(6, LZMA_CHECK_CRC64, nullptr,
                                  reinterpret_cast<const uint8_t*>(text.data()), text.size(),
                                  reinterpret_cast<uint8_t*>(out.data()), &position,
                                  out.size()) == LZMA_OK);
  out.resize(position);
  return out;
}

}  // namespace test_support
