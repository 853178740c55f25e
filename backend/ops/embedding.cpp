// embedding.hpp's op over Views: the views checked once, then the CPU or the CUDA twin
// (ops/dispatch.hpp).
#include "backend/ops/embedding.hpp"

#include "backend/ops/dispatch.hpp"

namespace backend::ops {

using namespace detail;

void embedding_forward(Device& device, View output, View tokens, View word_embeddings,
                       View position_embeddings, int64_t batch_size, int64_t seq_length,
                       int64_t hidden_size, int64_t vocab_start) {
  constexpr const char* op = "embedding_forward";
  const int64_t vocab_size = embedding_table_rows(word_embeddings.numel, hidden_size, op);
  run_typed(
      device, op, 0, output.type,
      [=](auto s) {
        using S = decltype(s);
        cpu::embedding_forward(host<S>(output), host_ids(tokens), host<S>(word_embeddings),
                               host<S>(position_embeddings), batch_size, seq_length,
                               hidden_size, vocab_start, vocab_size);
      },
      [&](auto s, const auto& context) {
        using S = decltype(s);
        cuda::embedding_forward(gpu<S>(output, op), gpu_ids(tokens, op),
                                gpu<S>(word_embeddings, op), gpu<S>(position_embeddings, op),
                                batch_size, seq_length, hidden_size, vocab_start, vocab_size,
                                context.stream);
      });
}

void embedding_backward(Device& device, View dword_embeddings, View dposition_embeddings,
                        View doutput, View token_index, int64_t batch_size, int64_t seq_length,
                        int64_t hidden_size, int64_t vocab_start) {
  constexpr const char* op = "embedding_backward";
  const int64_t vocab_size = embedding_table_rows(dword_embeddings.numel, hidden_size, op);
  check_token_index(token_index.numel, batch_size * seq_length, op);
  run_typed(
      device, op, 0, doutput.type,
      [=](auto s) {
        using S = decltype(s);
        cpu::embedding_backward(host<S>(dword_embeddings), host<S>(dposition_embeddings),
                                host<S>(doutput), host_ids(token_index), batch_size,
                                seq_length, hidden_size, vocab_start, vocab_size);
      },
      [&](auto s, const auto& context) {
        using S = decltype(s);
        cuda::embedding_backward(gpu<float>(dword_embeddings, op),
                                 gpu<float>(dposition_embeddings, op), gpu<S>(doutput, op),
                                 gpu_ids(token_index, op), batch_size, seq_length,
                                 hidden_size, vocab_start, vocab_size, context.stream);
      });
}

void embedding_at_positions_forward(Device& device, View output, View tokens, View positions,
                                    View word_embeddings, View position_embeddings, int64_t rows,
                                    int64_t hidden_size) {
  constexpr const char* op = "embedding_at_positions_forward";
  run_typed(
      device, op, 0, output.type,
      [=](auto s) {
        using S = decltype(s);
        cpu::embedding_at_positions_forward(host<S>(output), host_ids(tokens),
                                            host_ids(positions), host<S>(word_embeddings),
                                            host<S>(position_embeddings), rows, hidden_size);
      },
      [&](auto s, const auto& context) {
        using S = decltype(s);
        cuda::embedding_at_positions_forward(
            gpu<S>(output, op), gpu_ids(tokens, op), gpu_ids(positions, op),
            gpu<S>(word_embeddings, op), gpu<S>(position_embeddings, op), rows, hidden_size,
            context.stream);
      });
}

}  // namespace backend::ops
