// embedding_forward / embedding_backward: lookup, scatter-add with repeated tokens, central
// finite differences in double, float against double, vocabulary shards against the whole
// table.
#include "backend/ops/embedding.hpp"

#include <doctest/doctest.h>
#include <omp.h>

#include "backend/ops/gemm_cpu.hpp"
#include "tests/backend/ops/gradient_check.hpp"

namespace {

using namespace backend::testing;

// The backward's index of `tokens` (embedding.hpp), as the model makes it when it uploads them.
std::vector<int32_t> index_of(const std::vector<int32_t>& tokens) {
  std::vector<int32_t> index(static_cast<size_t>(backend::token_index_elements(std::ssize(tokens))));
  backend::index_tokens(tokens.data(), std::ssize(tokens), index.data());
  return index;
}

constexpr int64_t kEmbeddingBatch = 3;
constexpr int64_t kEmbeddingSeq = 4;
constexpr int64_t kHidden = 5;
constexpr int64_t kEmbeddingVocab = 6;      // small, so tokens repeat
constexpr int64_t kPositions = 7;  // more rows than the sequence uses

struct EmbeddingCase {
  std::vector<int32_t> tokens = random_ids(kEmbeddingBatch * kEmbeddingSeq, kEmbeddingVocab, 61);
  std::vector<double> word = random_values(kEmbeddingVocab * kHidden, 62);
  std::vector<double> position = random_values(kPositions * kHidden, 63);
  std::vector<double> doutput = random_values(kEmbeddingBatch * kEmbeddingSeq * kHidden, 64);
  std::vector<double> dword_start = random_values(kEmbeddingVocab * kHidden, 65);
  std::vector<double> dposition_start = random_values(kPositions * kHidden, 66);
};

struct EmbeddingResult {
  std::vector<double> output, dword, dposition;  // gradients: what backward added
};

template <typename Scalar>
EmbeddingResult run_embedding(const EmbeddingCase& c) {
  const auto word = convert<Scalar>(c.word);
  const auto position = convert<Scalar>(c.position);
  const auto doutput = convert<Scalar>(c.doutput);
  std::vector<Scalar> output(kEmbeddingBatch * kEmbeddingSeq * kHidden);
  auto dword = convert<Scalar>(c.dword_start);
  auto dposition = convert<Scalar>(c.dposition_start);
  backend::cpu::embedding_forward(output.data(), c.tokens.data(), word.data(), position.data(),
                                  kEmbeddingBatch, kEmbeddingSeq, kHidden, 0, kEmbeddingVocab);
  backend::cpu::embedding_backward(dword.data(), dposition.data(), doutput.data(),
                                   index_of(c.tokens).data(), kEmbeddingBatch, kEmbeddingSeq, kHidden, 0, kEmbeddingVocab);
  return {convert<double>(output), difference(convert<double>(dword), c.dword_start),
          difference(convert<double>(dposition), c.dposition_start)};
}

}  // namespace

TEST_CASE("embedding forward adds the token's row and the position's row") {
  EmbeddingCase c;
  const EmbeddingResult result = run_embedding<double>(c);
  for (int64_t b = 0; b < kEmbeddingBatch; ++b) {
    for (int64_t t = 0; t < kEmbeddingSeq; ++t) {
      const int64_t token = c.tokens[b * kEmbeddingSeq + t];
      for (int64_t i = 0; i < kHidden; ++i) {
        CHECK(result.output[(b * kEmbeddingSeq + t) * kHidden + i] ==
              c.word[token * kHidden + i] + c.position[t * kHidden + i]);
      }
    }
  }
}

TEST_CASE("embedding backward matches central finite differences in double") {
  EmbeddingCase c;
  // The test is only meaningful if some token repeats and some vocabulary row is unused.
  std::vector<int> uses(kEmbeddingVocab, 0);
  for (int32_t token : c.tokens) ++uses[token];
  CHECK(*std::max_element(uses.begin(), uses.end()) > 1);

  const EmbeddingResult result = run_embedding<double>(c);
  std::vector<double> output(kEmbeddingBatch * kEmbeddingSeq * kHidden);
  auto loss = [&] {
    backend::cpu::embedding_forward(output.data(), c.tokens.data(), c.word.data(),
                                    c.position.data(), kEmbeddingBatch, kEmbeddingSeq, kHidden, 0, kEmbeddingVocab);
    return dot(output, c.doutput);
  };
  BACKEND_CHECK_GRADIENT(check_gradient(c.word, result.dword, loss), 1e-6);
  BACKEND_CHECK_GRADIENT(check_gradient(c.position, result.dposition, loss), 1e-6);
  // Rows past the sequence length get nothing.
  for (int64_t i = kEmbeddingSeq * kHidden; i < kPositions * kHidden; ++i) CHECK(result.dposition[i] == 0);
}

TEST_CASE("embedding in float matches double") {
  EmbeddingCase c;
  const EmbeddingResult single = run_embedding<float>(c);
  const EmbeddingResult reference = run_embedding<double>(c);
  CHECK(error_relative_to_max(single.output, reference.output) < 1e-6);
  CHECK(error_relative_to_max(single.dword, reference.dword) < 1e-6);
  CHECK(error_relative_to_max(single.dposition, reference.dposition) < 1e-6);
}

TEST_CASE("embedding backward is the same on every thread count") {
  // Large enough that the loops run in parallel; a 3-token vocabulary forces collisions.
  constexpr int64_t batch = 4;
  constexpr int64_t seq = 64;
  constexpr int64_t hidden = 300;
  const auto tokens = random_ids(batch * seq, 3, 67);
  const auto doutput = random_values(batch * seq * hidden, 68);
  auto run = [&] {
    std::vector<double> gradients((3 + seq) * hidden, 0.1);
    backend::cpu::embedding_backward(gradients.data(), gradients.data() + 3 * hidden,
                                     doutput.data(), index_of(tokens).data(), batch, seq, hidden,
                                     0, 3);
    return gradients;
  };
  const auto [serial, parallel] = on_one_and_three_threads(run);
  CHECK(serial == parallel);
}

TEST_CASE("embedding without a position table (rotary positions) is the word lookup alone") {
  EmbeddingCase c;
  const EmbeddingResult with_table = run_embedding<double>(c);
  std::vector<double> output(kEmbeddingBatch * kEmbeddingSeq * kHidden, 1000.0);
  auto dword = c.dword_start;
  backend::cpu::embedding_forward(output.data(), c.tokens.data(), c.word.data(),
                                  static_cast<const double*>(nullptr), kEmbeddingBatch, kEmbeddingSeq, kHidden, 0,
                                  kEmbeddingVocab);
  backend::cpu::embedding_backward(dword.data(), static_cast<double*>(nullptr), c.doutput.data(),
                                   index_of(c.tokens).data(), kEmbeddingBatch, kEmbeddingSeq, kHidden, 0, kEmbeddingVocab);
  for (int64_t row = 0; row < kEmbeddingBatch * kEmbeddingSeq; ++row) {
    for (int64_t i = 0; i < kHidden; ++i) {
      CHECK(output[row * kHidden + i] == c.word[c.tokens[row] * kHidden + i]);
    }
  }
  // The word table's gradient does not depend on whether a position table exists.
  CHECK(difference(dword, c.dword_start) == with_table.dword);
}

TEST_CASE("index_tokens groups the positions by token, ascending within a token") {
  const std::vector<int32_t> tokens = {4, 1, 4, 0, 1, 4, 7};
  const int64_t count = std::ssize(tokens);
  std::vector<int32_t> index(static_cast<size_t>(backend::token_index_elements(count)), -1);
  backend::index_tokens(tokens.data(), count, index.data());
  const backend::TokenIndexLayout layout = backend::token_index_layout(count);
  auto part = [&](int64_t offset, int64_t size) {
    return std::vector<int32_t>(index.begin() + offset, index.begin() + offset + size);
  };
  CHECK(index[0] == 4);  // distinct tokens
  CHECK(part(layout.order, count) == std::vector<int32_t>{3, 1, 4, 0, 2, 5, 6});
  // Four segments and the end; the unused tails are zeros, so the bytes depend on the tokens.
  CHECK(part(layout.segment_starts, count + 1) == std::vector<int32_t>{0, 1, 3, 6, 7, 0, 0, 0});
  CHECK(part(layout.unique_tokens, count) == std::vector<int32_t>{0, 1, 4, 7, 0, 0, 0});

  // No positions: no distinct tokens, a segment start of 0.
  std::vector<int32_t> empty(static_cast<size_t>(backend::token_index_elements(0)), -1);
  backend::index_tokens(nullptr, 0, empty.data());
  CHECK(empty == std::vector<int32_t>{0, 0});
}

TEST_CASE("index_tokens refuses more positions than its int32 positions can name") {
  CHECK_THROWS_WITH_AS(backend::index_tokens(nullptr, int64_t{1} << 31, nullptr),
                       "index_tokens: 2147483648 positions do not fit the token index's int32 "
                       "positions",
                       common::Error);
}

TEST_CASE(
    "the embedding backward sums repeated tokens in the groups' order, on one thread and on three, "
    "bit for bit") {
  // The order of additions the GPU twin repeats (one owner per token row; a token's k-th
  // position into group k mod G, the groups added in order, then onto the row: embedding.hpp's
  // formula, written out here), with enough work to run threaded and some 240 positions per
  // token, so every group holds many.
  constexpr int64_t batch = 3;
  constexpr int64_t seq = 400;
  constexpr int64_t hidden = 70;  // two column chunks, the second partial
  constexpr int32_t vocab = 5;
  const int64_t count = batch * seq;
  REQUIRE(count * hidden > backend::cpu::detail::kParallelWork);
  const auto tokens = random_ids(count, vocab, 69);
  const auto doutput = convert<float>(random_values(count * hidden, 70));
  const auto start = convert<float>(random_values(vocab * hidden, 71));
  auto expected = start;
  constexpr int kGroups = backend::kEmbeddingGradientGroups;
  for (int32_t token = 0; token < vocab; ++token) {
    for (int64_t c = 0; c < hidden; ++c) {
      float partial[kGroups] = {};
      int64_t k = 0;
      for (int64_t row = 0; row < count; ++row) {
        if (tokens[row] == token) partial[k++ % kGroups] += doutput[row * hidden + c];
      }
      float total = 0;
      for (const float value : partial) total += value;
      expected[token * hidden + c] += total;
    }
  }
  const auto index = index_of(tokens);
  const auto [serial, parallel] = on_one_and_three_threads([&] {
    auto dword = start;
    backend::cpu::embedding_backward(dword.data(), static_cast<float*>(nullptr), doutput.data(),
                                     index.data(), batch, seq, hidden, 0, vocab);
    return dword;
  });
  CHECK(serial == expected);
  CHECK(parallel == expected);
}

namespace {

// [begin, end) of shard k of `parts` over `vocab` rows: uneven when parts does not divide it.
std::pair<int64_t, int64_t> shard_range(int64_t vocab, int64_t parts, int64_t k) {
  return {k * vocab / parts, (k + 1) * vocab / parts};
}

}  // namespace

TEST_CASE(
    "embedding over vocabulary shards sums to the whole table's, and its gradients are "
    "the whole table's rows") {
  // Megatron's VocabParallelEmbedding: each shard looks up the tokens it holds; the position
  // table goes to shard 0 only, so the outputs sum to the full embedding exactly.
  constexpr int64_t vocab = 7;  // 2 and 3 shards of unequal size
  const auto tokens = random_ids(kEmbeddingBatch * kEmbeddingSeq, vocab, 81);
  const auto word = random_values(vocab * kHidden, 82);
  const auto position = random_values(kPositions * kHidden, 83);
  const auto doutput = random_values(kEmbeddingBatch * kEmbeddingSeq * kHidden, 84);
  const auto dword_start = random_values(vocab * kHidden, 85);
  const auto dposition_start = random_values(kPositions * kHidden, 86);
  const int64_t count = kEmbeddingBatch * kEmbeddingSeq * kHidden;

  std::vector<double> full(count);
  auto full_dword = dword_start;
  auto full_dposition = dposition_start;
  backend::cpu::embedding_forward(full.data(), tokens.data(), word.data(), position.data(), kEmbeddingBatch,
                                  kEmbeddingSeq, kHidden, 0, vocab);
  backend::cpu::embedding_backward(full_dword.data(), full_dposition.data(), doutput.data(),
                                   index_of(tokens).data(), kEmbeddingBatch, kEmbeddingSeq, kHidden, 0, vocab);

  for (const int64_t parts : {1, 2, 3}) {
    CAPTURE(parts);
    std::vector<double> sum(count, 0.0);
    for (int64_t k = 0; k < parts; ++k) {
      CAPTURE(k);
      const auto [begin, end] = shard_range(vocab, parts, k);
      const std::vector<double> shard_word(word.begin() + begin * kHidden,
                                           word.begin() + end * kHidden);
      const double* shard_position = k == 0 ? position.data() : nullptr;
      std::vector<double> output(count, 1000.0);  // must be overwritten
      backend::cpu::embedding_forward(output.data(), tokens.data(), shard_word.data(),
                                      shard_position, kEmbeddingBatch, kEmbeddingSeq, kHidden, begin, end - begin);
      for (int64_t row = 0; row < kEmbeddingBatch * kEmbeddingSeq; ++row) {
        if (tokens[row] >= begin && tokens[row] < end) continue;
        // Another shard's token: the position row alone on shard 0, zeros on the others.
        for (int64_t i = 0; i < kHidden; ++i) {
          CHECK(output[row * kHidden + i] == (k == 0 ? position[(row % kEmbeddingSeq) * kHidden + i] : 0.0));
        }
      }
      for (int64_t i = 0; i < count; ++i) sum[i] += output[i];

      // Every shard given a position gradient sums every position into it.
      std::vector<double> dword(dword_start.begin() + begin * kHidden,
                                dword_start.begin() + end * kHidden);
      auto dposition = dposition_start;
      backend::cpu::embedding_backward(dword.data(), dposition.data(), doutput.data(),
                                       index_of(tokens).data(), kEmbeddingBatch, kEmbeddingSeq, kHidden, begin, end - begin);
      CHECK(dword == std::vector<double>(full_dword.begin() + begin * kHidden,
                                         full_dword.begin() + end * kHidden));
      CHECK(dposition == full_dposition);
    }
    CHECK(sum == full);
  }
}

TEST_CASE("an embedding shard holding none of the tokens gives the position rows, or zeros") {
  // An empty shard past the vocabulary: every token is another shard's.
  EmbeddingCase c;
  std::vector<double> output(kEmbeddingBatch * kEmbeddingSeq * kHidden, 1000.0);
  backend::cpu::embedding_forward(output.data(), c.tokens.data(),
                                  static_cast<const double*>(nullptr), c.position.data(), kEmbeddingBatch,
                                  kEmbeddingSeq, kHidden, kEmbeddingVocab, 0);
  for (int64_t row = 0; row < kEmbeddingBatch * kEmbeddingSeq; ++row) {
    for (int64_t i = 0; i < kHidden; ++i) {
      CHECK(output[row * kHidden + i] == c.position[(row % kEmbeddingSeq) * kHidden + i]);
    }
  }
  std::vector<double> zeros(kEmbeddingBatch * kEmbeddingSeq * kHidden, 1000.0);
  backend::cpu::embedding_forward(
      zeros.data(), c.tokens.data(), static_cast<const double*>(nullptr),
      static_cast<const double*>(nullptr), kEmbeddingBatch, kEmbeddingSeq, kHidden, kEmbeddingVocab, 0);
  CHECK(zeros == std::vector<double>(zeros.size(), 0.0));
}

TEST_CASE("embedding at positions of their own is embedding_forward's rows, in any order") {
  const int64_t batch = 2, seq = 5, hidden = 6, vocab = 11;
  const auto word = random_values(static_cast<size_t>(vocab * hidden), 91);
  const auto position = random_values(static_cast<size_t>(seq * hidden), 92);
  const auto tokens = random_ids(static_cast<size_t>(batch * seq), static_cast<int32_t>(vocab), 93);
  for (const bool with_table : {true, false}) {
    const double* table = with_table ? position.data() : nullptr;
    std::vector<double> whole(static_cast<size_t>(batch * seq * hidden));
    backend::cpu::embedding_forward(whole.data(), tokens.data(), word.data(), table, batch, seq,
                                    hidden, 0, vocab);
    // The rows reversed, each at its own position.
    std::vector<int32_t> row_tokens, row_positions;
    for (int64_t r = batch * seq - 1; r >= 0; --r) {
      row_tokens.push_back(tokens[static_cast<size_t>(r)]);
      row_positions.push_back(static_cast<int32_t>(r % seq));
    }
    std::vector<double> rows(whole.size(), NAN);
    backend::cpu::embedding_at_positions_forward(rows.data(), row_tokens.data(),
                                                 row_positions.data(), word.data(), table,
                                                 batch * seq, hidden);
    for (int64_t r = 0; r < batch * seq; ++r) {
      for (int64_t c = 0; c < hidden; ++c) {
        CHECK(rows[static_cast<size_t>((batch * seq - 1 - r) * hidden + c)] ==
              whole[static_cast<size_t>(r * hidden + c)]);
      }
    }
  }
}
