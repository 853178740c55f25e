// Resharding a checkpoint to another tensor- and pipeline-parallel size; see
// checkpoint_reshard.hpp. Reference: Megatron-LM tools/checkpoint/loader_megatron.py (the
// shards concatenated whole, the stages' layers collected in order, the tied copy skipped),
// saver_megatron.py / saver_base.py (pad_weight, torch.chunk into the target's shards, the
// layers dealt out to the target's stages, the last stage's output_layer from the embedding).
#include "backend/ckpt/checkpoint_reshard.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <span>
#include <stdexcept>
#include <system_error>
#include <unordered_set>
#include <utility>

#include "backend/ckpt/checkpoint.hpp"
#include "backend/ckpt/checkpoint_file.hpp"
#include "backend/ckpt/checkpoint_record.hpp"
#include "backend/ckpt/megatron_checkpoint.hpp"
#include "backend/ckpt/shard_file.hpp"
#include "backend/common/error.hpp"
#include "backend/common/memory_estimate.hpp"
#include "backend/common/python_format.hpp"
#include "backend/model/gpt_config.hpp"
#include "backend/model/parameter_layout.hpp"
#include "backend/model/pipeline_stage.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace backend {

using common::format_python_shape;

namespace {

constexpr const char* kWordEmbeddings = "embedding.word_embeddings.weight";

// A file's place, {size, rank}, in its "tensor_parallel" or "pipeline_parallel" group ({1, 0}
// for files from before the field).
struct GroupPlace {
  int64_t size = 1;
  int64_t rank = 0;
};
GroupPlace saved_place(const CheckpointMetadata& metadata, const char* group) {
  if (!metadata.has(group)) return {};
  return {metadata.get<int64_t>(metadata.section(group), "size"),
          metadata.get<int64_t>(metadata.section(group), "rank")};
}

// The checkpoint to reshard: every (tensor-parallel rank, stage)'s file open, the arguments and
// the model they describe.
struct Source {
  TrackedCheckpoint tracked;
  // Stage by stage, a stage's tensor-parallel ranks in order (file()).
  std::vector<std::unique_ptr<ShardFile>> readers;
  CheckpointModelRecord arguments;  // the model its record describes
  GptConfig config;
  int64_t tensor_parallel = 1;
  int64_t pipeline_parallel = 1;
  int64_t virtual_chunks = 1;  // model chunks per stage (the interleaved schedule's)
  bool optimizer_state = false;
  // Why the optimizer state is not carried, when the checkpoint is one that has it otherwise (a
  // Megatron checkpoint's state this backend does not read); empty otherwise.
  std::string optimizer_not_read;

  const ShardFile& file(int64_t rank, int64_t stage) const {
    return *readers[static_cast<size_t>(stage * tensor_parallel + rank)];
  }
  PipelineStage stage(int64_t rank) const {
    return {.pipeline_parallel = pipeline_parallel, .rank = rank, .virtual_chunks = virtual_chunks};
  }
};

// "mp_rank_00..mp_rank_01", or "mp_rank_00_000..mp_rank_01_001" with stages.
std::string file_range_text(int64_t tensor_parallel, int64_t pipeline_parallel) {
  return checkpoint_rank_directory_name(0, 0, pipeline_parallel) + ".." +
         checkpoint_rank_directory_name(tensor_parallel - 1, pipeline_parallel - 1,
                                        pipeline_parallel);
}

// "--tensor-model-parallel-size 2", with " and --pipeline-model-parallel-size 2" when pipelined.
std::string saved_sizes_text(int64_t tensor_parallel, int64_t pipeline_parallel) {
  std::string text = fmt::format("--tensor-model-parallel-size {}", tensor_parallel);
  if (pipeline_parallel > 1) {
    text += fmt::format(" and --pipeline-model-parallel-size {}", pipeline_parallel);
  }
  return text;
}

// Why `layers_per_virtual_stage` layers per model chunk cannot be trained with `num_layers`
// layers over `pipeline_parallel` stages (the trainer's rules, validate_arguments in
// arguments.cpp), empty when it can; 0 (no interleaving) always can.
std::string interleaving_problem(int64_t num_layers, int64_t pipeline_parallel,
                                 int64_t layers_per_virtual_stage) {
  if (layers_per_virtual_stage == 0) return {};
  // Two stages are enough with the schedule's overlapped transfers, its default (a run at P = 2
  // with --no-overlap-p2p-communication is refused by pretrain_gpt itself, saying why).
  if (pipeline_parallel == 1) {
    return "the interleaved schedule needs a pipeline-parallel size greater than 1";
  }
  const int64_t per_stage = num_layers / pipeline_parallel;
  if (per_stage % layers_per_virtual_stage != 0) {
    return fmt::format("it does not divide the {} layers of each stage", per_stage);
  }
  return {};
}

// The divisors of n, "1, 2, 4, 8": the pipeline sizes a model of n layers can take.
std::string divisors_text(int64_t n) {
  std::string text;
  for (int64_t d = 1; d <= n; ++d) {
    if (n % d == 0) text += (text.empty() ? "" : ", ") + std::to_string(d);
  }
  return text;
}

// Everything of the first file's metadata but its place in the groups ("tensor_parallel",
// "pipeline_parallel") must be every other file's too: the files of one save share the
// iteration, the samples, the optimizer and scheduler state, the RNG, the arguments.
void check_same_metadata(const ShardFile& first, const ShardFile& other) {
  json a = first.metadata();
  json b = other.metadata();
  for (const char* place : {"tensor_parallel", "pipeline_parallel"}) {
    a.erase(place);
    b.erase(place);
  }
  if (a == b) return;
  std::string key = "?";
  for (const auto& [name, value] : a.items()) {
    if (!b.contains(name) || b[name] != value) {
      key = name;
      break;
    }
  }
  if (key == "?") {
    for (const auto& [name, value] : b.items()) {
      if (!a.contains(name)) {
        key = name;
        break;
      }
    }
  }
  common::fail(
      "checkpoint {}: its metadata differs from {}'s in '{}': the shards of one "
      "checkpoint are saved together, so these are not (was a file copied in from "
      "another run or iteration?)",
      other.path().string(), first.path().string(), key);
}

// A Megatron-LM checkpoint (megatron_checkpoint.hpp): its files as this backend's, checked
// there; the padded vocabulary its args record must be the one its model's record gives.
Source open_megatron_source(const fs::path& directory) {
  MegatronShards shards = open_megatron_shards(directory);
  Source source;
  source.tracked = {.iteration = shards.layout.iteration,
                    .release = shards.layout.release,
                    .file = shards.layout.rank_file(0, 0)};
  source.readers = std::move(shards.files);
  source.optimizer_state = shards.optimizer_not_read.empty();
  source.optimizer_not_read = shards.optimizer_not_read;
  source.arguments = shards.record;
  source.tensor_parallel = shards.layout.tensor_parallel;
  source.pipeline_parallel = shards.layout.pipeline_parallel;
  source.virtual_chunks =
      source.arguments.parallelism.virtual_pipeline_chunks(source.arguments.model.num_layers);
  source.config = model_config(source.arguments);
  if (shards.padded_vocab_size != source.config.padded_vocab_size) {
    common::fail(
        "{}: its args.padded_vocab_size is {}, but its tokenizer ({} tokens) padded to "
        "--make-vocab-size-divisible-by {} × --tensor-model-parallel-size {} gives {}",
        source.tracked.file.string(), shards.padded_vocab_size, source.config.vocab_size,
        source.arguments.model.make_vocab_size_divisible_by, source.tensor_parallel,
        source.config.padded_vocab_size);
  }
  return source;
}

Source open_source(const fs::path& directory) {
  if (is_megatron_checkpoint(directory)) return open_megatron_source(directory);
  Source source;
  source.tracked = require_checkpoint(directory, "--load");
  const TrackedCheckpoint& tracked = source.tracked;
  // The first file (mp_rank_00, or mp_rank_00_000 of a pipelined checkpoint) says how many
  // files there are, and what model they hold.
  std::unique_ptr<ShardFile> first_reader = open_native_shard_file(tracked.file);
  const ShardFile& first = *first_reader;
  const CheckpointMetadata metadata(first.metadata(), first.path());
  source.tensor_parallel = saved_place(metadata, "tensor_parallel").size;
  source.pipeline_parallel = saved_place(metadata, "pipeline_parallel").size;
  source.arguments =
      read_model_record(CheckpointMetadata(first.metadata(), first.path()), first.path());
  if (source.arguments.parallelism.tensor_model_parallel_size != source.tensor_parallel) {
    common::fail(
        "checkpoint {}: its metadata says tensor-parallel size {} but its arguments "
        "--tensor-model-parallel-size {} (the file was not written by this backend's "
        "save_checkpoint)",
        first.path().string(), source.tensor_parallel,
        source.arguments.parallelism.tensor_model_parallel_size);
  }
  if (source.arguments.parallelism.pipeline_model_parallel_size != source.pipeline_parallel) {
    common::fail(
        "checkpoint {}: its metadata says pipeline-parallel size {} but its arguments "
        "--pipeline-model-parallel-size {} (the file was not written by this backend's "
        "save_checkpoint)",
        first.path().string(), source.pipeline_parallel,
        source.arguments.parallelism.pipeline_model_parallel_size);
  }
  if (source.tensor_parallel < 1 || source.pipeline_parallel < 1) {
    common::fail(
        "checkpoint {}: its metadata says tensor-parallel size {} and pipeline-parallel "
        "size {}; both are at least 1 (the file was not written by this backend's "
        "save_checkpoint)",
        first.path().string(), source.tensor_parallel, source.pipeline_parallel);
  }
  // Which stage holds which layers: the trainer's layout (pipeline_stage.hpp), which the saved
  // sizes must allow.
  const int64_t num_layers = source.arguments.model.num_layers;
  const int64_t per_virtual_stage =
      source.arguments.parallelism.num_layers_per_virtual_pipeline_stage;
  if (num_layers % source.pipeline_parallel != 0 || per_virtual_stage < 0 ||
      (per_virtual_stage > 0 && (num_layers / source.pipeline_parallel) % per_virtual_stage != 0)) {
    common::fail(
        "checkpoint {}: its arguments --num-layers {} --pipeline-model-parallel-size {} "
        "--num-layers-per-virtual-pipeline-stage {} do not cut the layers into stages "
        "(the file was not written by this backend's save_checkpoint)",
        first.path().string(), num_layers, source.pipeline_parallel, per_virtual_stage);
  }
  source.virtual_chunks = source.arguments.parallelism.virtual_pipeline_chunks(num_layers);
  // The tracker finds mp_rank_00 before mp_rank_00_000: the first file's name must be the one
  // its pipeline size gives.
  if (checkpoint_rank_file(tracked, 0, 0, source.pipeline_parallel) != tracked.file) {
    common::fail(
        "checkpoint {} records --pipeline-model-parallel-size {}, whose first file is "
        "{}: the files were renamed or mixed up",
        first.path().string(), source.pipeline_parallel,
        checkpoint_rank_file(tracked, 0, 0, source.pipeline_parallel).string());
  }
  if (!tracked.release) {
    const auto iteration = metadata.get<int64_t>("iteration");
    if (iteration != tracked.iteration) {
      common::fail("checkpoint {} holds iteration {}, but the tracker {} says {}",
                   first.path().string(), iteration, checkpoint_tracker_path(directory).string(),
                   tracked.iteration);
    }
  }
  source.readers.push_back(std::move(first_reader));
  for (int64_t stage = 0; stage < source.pipeline_parallel; ++stage) {
    for (int64_t rank = 0; rank < source.tensor_parallel; ++rank) {
      if (stage == 0 && rank == 0) continue;
      const fs::path file = checkpoint_rank_file(tracked, rank, stage, source.pipeline_parallel);
      if (!fs::is_regular_file(file)) {
        common::fail(
            "--load {}: {} is missing: the checkpoint {} was saved with {}, and "
            "resharding needs every one of its files {}",
            directory.string(), file.string(), tracked.file.parent_path().parent_path().string(),
            saved_sizes_text(source.tensor_parallel, source.pipeline_parallel),
            file_range_text(source.tensor_parallel, source.pipeline_parallel));
      }
      source.readers.push_back(open_native_shard_file(file));
    }
  }
  for (int64_t stage = 0; stage < source.pipeline_parallel; ++stage) {
    for (int64_t rank = 0; rank < source.tensor_parallel; ++rank) {
      const ShardFile& reader = source.file(rank, stage);
      const CheckpointMetadata file_metadata(reader.metadata(), reader.path());
      const GroupPlace tensor = saved_place(file_metadata, "tensor_parallel");
      if (tensor.size != source.tensor_parallel || tensor.rank != rank) {
        common::fail(
            "checkpoint {} is the file of tensor-parallel rank {} of {}, but it records "
            "rank {} of {}: the shard files were moved or mixed up",
            reader.path().string(), rank, source.tensor_parallel, tensor.rank, tensor.size);
      }
      const GroupPlace pipeline = saved_place(file_metadata, "pipeline_parallel");
      if (pipeline.size != source.pipeline_parallel || pipeline.rank != stage) {
        common::fail(
            "checkpoint {} is the file of pipeline stage {} of {}, but it records stage "
            "{} of {}: the stage files were moved or mixed up",
            reader.path().string(), stage, source.pipeline_parallel, pipeline.rank, pipeline.size);
      }
      if (stage > 0 || rank > 0) check_same_metadata(first, reader);
    }
  }
  source.config = model_config(source.arguments);
  const auto padded = metadata.get<int64_t>("padded_vocab_size");
  if (padded != source.config.padded_vocab_size) {
    common::fail(
        "checkpoint {}: its padded vocabulary is {} rows, but its arguments give {} "
        "(the file was not written by this backend's save_checkpoint)",
        first.path().string(), padded, source.config.padded_vocab_size);
  }
  source.optimizer_state = metadata.has("optimizer");
  return source;
}

// Reads `name` from `reader` into `destination`, whose shape the layout says it has.
void read_shard(const ShardFile& reader, const std::string& name, const std::vector<int64_t>& shape,
                int64_t tensor_parallel, std::span<float> destination) {
  const std::vector<int64_t>* saved_shape = reader.shape(name);
  if (saved_shape == nullptr) {
    common::fail("checkpoint {} has no tensor '{}', which the model its arguments describe has",
                 reader.path().string(), name);
  }
  if (*saved_shape != shape) {
    common::fail(
        "checkpoint {}: tensor '{}' has the shape {}, where the model its arguments "
        "describe has {} at --tensor-model-parallel-size {}",
        reader.path().string(), name, format_python_shape(*saved_shape), format_python_shape(shape),
        tensor_parallel);
  }
  reader.read(name, destination);
}

// A file holding a tensor the model does not have is not what its arguments describe.
void check_no_other_tensors(const ShardFile& reader, const ParameterLayout& layout,
                            bool optimizer_state) {
  std::unordered_set<std::string> names;
  for (const auto& tensor : layout.tensors()) names.insert(tensor.name);
  for (const std::string& saved : reader.tensor_names()) {
    std::string name = saved;
    for (const char* prefix : {kCheckpointExpAvgPrefix, kCheckpointExpAvgSqPrefix}) {
      if (optimizer_state && name.starts_with(prefix)) {
        name = name.substr(std::string(prefix).size());
        break;
      }
    }
    if (names.count(name) == 0) {
      common::fail(
          "checkpoint {} holds the tensor '{}', which the model its arguments describe "
          "does not have",
          reader.path().string(), saved);
    }
  }
}

// The whole model: parameters and moments in the unsharded layout's flat order.
struct WholeState {
  std::vector<float> parameters, exp_avg, exp_avg_sq;
};

// The names a buffer's tensors have in a file: the parameter's, or with a moment's prefix.
struct StatePart {
  const char* prefix;
  std::vector<float> WholeState::*buffer;
};
constexpr StatePart kParameters{"", &WholeState::parameters};
constexpr StatePart kMoments[] = {{kCheckpointExpAvgPrefix, &WholeState::exp_avg},
                                  {kCheckpointExpAvgSqPrefix, &WholeState::exp_avg_sq}};

std::vector<StatePart> state_parts(bool optimizer_state) {
  std::vector<StatePart> parts = {kParameters};
  if (optimizer_state) parts.insert(parts.end(), std::begin(kMoments), std::end(kMoments));
  return parts;
}

// Every source shard put in its place in the whole tensors (Megatron's loader concatenates
// them; here each shard's pieces, shard_pieces, are copied where the layout says), stage by
// stage, each tensor by its global name; the moments too with `moments` (when the checkpoint
// has them). The last stage's tied copy is not read: the first stage's word embedding is the
// tensor (the trainer keeps the two equal).
WholeState assemble(const Source& source, const ParameterLayout& whole, bool moments) {
  WholeState state;
  const auto parts = state_parts(moments && source.optimizer_state);
  for (const StatePart& part : parts)
    (state.*part.buffer).resize(static_cast<size_t>(whole.numel()));
  std::vector<float> shard;
  for (int64_t stage = 0; stage < source.pipeline_parallel; ++stage) {
    for (int64_t rank = 0; rank < source.tensor_parallel; ++rank) {
      const ShardFile& reader = source.file(rank, stage);
      const ParameterLayout layout(source.config, source.tensor_parallel, rank,
                                   source.stage(stage));
      check_no_other_tensors(reader, layout, source.optimizer_state);
      // The distributed optimizer's moments are in files of their own, flat (checkpoint.hpp).
      const CheckpointMetadata metadata(reader.metadata(), reader.path());
      const bool flat_moments = parts.size() > 1 && has_distributed_moments(metadata);
      WholeState rank_moments;
      if (flat_moments) {
        for (const StatePart& part : kMoments) {
          (rank_moments.*part.buffer).resize(static_cast<size_t>(layout.numel()));
        }
        read_distributed_moments(reader.path(), metadata, layout.numel(), {0, layout.numel()},
                                 rank_moments.exp_avg, rank_moments.exp_avg_sq);
      }
      for (const ParameterTensor& tensor : layout.tensors()) {
        if (tensor.tied_copy) continue;
        const ParameterTensor& target = whole.tensor(tensor.name);
        shard.resize(static_cast<size_t>(tensor.numel));
        for (const StatePart& part : parts) {
          if (flat_moments && part.buffer != kParameters.buffer) {
            const auto& flat = rank_moments.*part.buffer;
            std::copy_n(flat.begin() + tensor.offset, tensor.numel, shard.begin());
          } else {
            read_shard(reader, part.prefix + tensor.name, tensor.shape, source.tensor_parallel,
                       shard);
          }
          float* values = (state.*part.buffer).data() + target.offset;
          for (const ShardPiece& piece : shard_pieces(tensor, source.tensor_parallel, rank)) {
            std::memcpy(values + piece.full_offset, shard.data() + piece.shard_offset,
                        static_cast<size_t>(piece.numel) * sizeof(float));
          }
        }
      }
    }
  }
  return state;
}

// Elements [first, first + count) of the target's whole tensor (shape `target_shape`), from the
// source's whole tensor at `source` (shape `source_shape`): the same elements where the shapes
// agree; a vocabulary table whose rows differ keeps the source's first rows and repeats its
// last row below them (Megatron's pad_weight).
void copy_whole_range(const float* source, const std::vector<int64_t>& source_shape,
                      const std::vector<int64_t>& target_shape, int64_t first, int64_t count,
                      float* destination) {
  if (source_shape == target_shape) {
    std::memcpy(destination, source + first, static_cast<size_t>(count) * sizeof(float));
    return;
  }
  const int64_t columns = target_shape[1];
  const int64_t source_rows = source_shape[0];
  for (int64_t done = 0; done < count;) {
    const int64_t row = (first + done) / columns;
    const int64_t column = (first + done) % columns;
    const int64_t run = std::min(count - done, columns - column);
    const int64_t source_row = std::min(row, source_rows - 1);
    std::memcpy(destination + done, source + source_row * columns + column,
                static_cast<size_t>(run) * sizeof(float));
    done += run;
  }
}

// The tensors of target rank `rank` of `stage`: each whole tensor's pieces (shard_pieces of the
// target layout) copied from the whole state into `storage` (the parameters, then the
// moments), listed in save_checkpoint's order: every parameter, then each parameter's two
// moments. The last stage's tied copy (output_layer.weight) is cut from the word embedding, as
// the trainer makes it (parameter_layout.hpp), and so are its moments.
CheckpointRankFile target_rank_file(const WholeState& state, const ParameterLayout& source_whole,
                                    const GptConfig& target_config, int64_t target_tensor_parallel,
                                    int64_t rank, const PipelineStage& stage, bool optimizer_state,
                                    const json& metadata, std::vector<float>& storage) {
  const ParameterLayout layout(target_config, target_tensor_parallel, rank, stage);
  const auto parts = state_parts(optimizer_state);
  const auto numel = static_cast<size_t>(layout.numel());
  storage.assign(numel * parts.size(), 0.0f);
  std::vector<std::vector<CheckpointTensor>> part_tensors(parts.size());
  for (size_t p = 0; p < parts.size(); ++p) {
    float* part_storage = storage.data() + p * numel;
    for (const ParameterTensor& tensor : layout.tensors()) {
      const ParameterTensor& source =
          source_whole.tensor(tensor.tied_copy ? kWordEmbeddings : tensor.name);
      const float* source_values = (state.*parts[p].buffer).data() + source.offset;
      float* shard = part_storage + tensor.offset;
      for (const ShardPiece& piece : shard_pieces(tensor, target_tensor_parallel, rank)) {
        copy_whole_range(source_values, source.shape, tensor.full_shape, piece.full_offset,
                         piece.numel, shard + piece.shard_offset);
      }
      part_tensors[p].push_back({parts[p].prefix + tensor.name, tensor.shape,
                                 std::span<const float>(shard, static_cast<size_t>(tensor.numel))});
    }
  }
  CheckpointRankFile file;
  file.metadata = metadata;
  file.tensors = std::move(part_tensors[0]);
  for (size_t t = 0; optimizer_state && t < layout.tensors().size(); ++t) {
    file.tensors.push_back(part_tensors[1][t]);
    file.tensors.push_back(part_tensors[2][t]);
  }
  return file;
}

// Only the vocabulary tables may differ between the whole source and target models, and only
// in their rows; a cut may drop padding rows only.
void check_vocabulary_change(const ParameterLayout& source_whole,
                             const ParameterLayout& target_whole, const GptConfig& target_config,
                             const fs::path& file) {
  for (const ParameterTensor& tensor : target_whole.tensors()) {
    const ParameterTensor& source = source_whole.tensor(tensor.name);
    if (source.shape == tensor.shape) continue;
    const bool vocabulary = tensor.name == kWordEmbeddings || tensor.name == "output_layer.weight";
    if (!vocabulary || source.shape.size() != 2 || source.shape[1] != tensor.shape[1]) {
      throw std::logic_error(fmt::format("resharding changes the shape of '{}' from {} to {}",
                                         tensor.name, format_python_shape(source.shape),
                                         format_python_shape(tensor.shape)));
    }
    if (tensor.shape[0] < target_config.vocab_size) {
      common::fail(
          "checkpoint {}: cutting '{}' to {} rows would drop rows of the tokenizer's {} "
          "tokens; pass a --make-vocab-size-divisible-by that pads to at least {}",
          file.string(), tensor.name, tensor.shape[0], target_config.vocab_size,
          target_config.vocab_size);
    }
  }
}

bool same_directory(const fs::path& a, const fs::path& b) {
  std::error_code error;
  if (fs::exists(a, error) && fs::exists(b, error)) {
    const bool same = fs::equivalent(a, b, error);
    if (!error) return same;
  }
  return fs::weakly_canonical(a, error) == fs::weakly_canonical(b, error);
}

// The metadata of the target's files, their place in the groups aside: the source's, with the
// target's sizes and vocabulary in it, and where it came from.
json target_metadata(const json& source_metadata, const Source& source,
                     const GptConfig& target_config, const CheckpointModelRecord& target_arguments,
                     const ReshardOptions& options) {
  const CheckpointModelRecord& t = target_arguments;
  json metadata = source_metadata;
  metadata["padded_vocab_size"] = target_config.padded_vocab_size;
  // The moments go into the target's own files, whole (the distributed optimizer's files are
  // the trainer's; a run with it keeps its range of these).
  if (metadata.contains("optimizer") && metadata["optimizer"].is_object()) {
    metadata["optimizer"].erase("distributed");
  }
  json& arguments = metadata["arguments"];
  arguments["tensor_model_parallel_size"] = t.parallelism.tensor_model_parallel_size;
  arguments["pipeline_model_parallel_size"] = t.parallelism.pipeline_model_parallel_size;
  arguments["num_layers_per_virtual_pipeline_stage"] =
      t.parallelism.num_layers_per_virtual_pipeline_stage;
  arguments["make_vocab_size_divisible_by"] = t.model.make_vocab_size_divisible_by;
  // The arguments dump (text, as pretrain_gpt prints it) of a run at the target's sizes.
  if (metadata.contains("args") && metadata["args"].is_object()) {
    json& args = metadata["args"];
    args["tensor_model_parallel_size"] = std::to_string(t.parallelism.tensor_model_parallel_size);
    args["pipeline_model_parallel_size"] =
        std::to_string(t.parallelism.pipeline_model_parallel_size);
    // Megatron's dump has these two (None without interleaving); ours, when it has them.
    if (args.contains("num_layers_per_virtual_pipeline_stage")) {
      args["num_layers_per_virtual_pipeline_stage"] =
          t.parallelism.num_layers_per_virtual_pipeline_stage > 0
              ? std::to_string(t.parallelism.num_layers_per_virtual_pipeline_stage)
              : std::string("None");
    }
    if (args.contains("virtual_pipeline_model_parallel_size")) {
      args["virtual_pipeline_model_parallel_size"] =
          t.parallelism.num_layers_per_virtual_pipeline_stage > 0
              ? std::to_string(t.parallelism.virtual_pipeline_chunks(t.model.num_layers))
              : std::string("None");
    }
    args["make_vocab_size_divisible_by"] = std::to_string(t.model.make_vocab_size_divisible_by);
    if (t.parallelism.tensor_model_parallel_size == 1 && args.contains("sequence_parallel")) {
      args["sequence_parallel"] = "False";  // Megatron switches it off at tp 1
    }
    // The same data-parallel size on tp × pp × dp processes.
    if (args.contains("data_parallel_size") && args["data_parallel_size"].is_string()) {
      const std::string text = args["data_parallel_size"].get<std::string>();
      int64_t data_parallel = 0;
      const auto [end, error] =
          std::from_chars(text.data(), text.data() + text.size(), data_parallel);
      if (error == std::errc() && end == text.data() + text.size() && data_parallel > 0) {
        args["world_size"] =
            std::to_string(data_parallel * t.parallelism.tensor_model_parallel_size *
                           t.parallelism.pipeline_model_parallel_size);
      }
    }
  }
  metadata["resharded"] = {{"from_tensor_parallel_size", source.tensor_parallel},
                           {"from_pipeline_parallel_size", source.pipeline_parallel},
                           {"from_num_layers_per_virtual_pipeline_stage",
                            source.arguments.parallelism.num_layers_per_virtual_pipeline_stage},
                           {"from_padded_vocab_size", source.config.padded_vocab_size},
                           {"command_line", options.command_line}};
  return metadata;
}

}  // namespace

GptModel<float> load_whole_checkpoint_weights(const fs::path& directory, std::ostream& out) {
  const Source source = open_source(directory);
  const ShardFile& first = *source.readers.front();
  if (source.tracked.release) {
    out << fmt::format(" loading release checkpoint from {}\n", directory.string());
  } else {
    out << fmt::format(" loading checkpoint from {} at iteration {}\n", directory.string(),
                       source.tracked.iteration);
  }
  common::require_memory_fits(
      common::estimate_conversion_memory(model_shape(source.config)), common::available_memory(),
      fmt::format("{}: the model its arguments describe", first.path().string()),
      "Convert it on a machine with more memory.");
  const ParameterLayout whole(source.config);
  const WholeState state = assemble(source, whole, false);
  GptModel<float> model(source.config);
  model.copy_parameters_from_host(state.parameters);
  if (source.pipeline_parallel == 1) {
    out << fmt::format(
        "  successfully loaded the weights of {} from its {} tensor-parallel shard "
        "file(s), assembled whole\n",
        directory.string(), source.tensor_parallel);
  } else {
    out << fmt::format(
        "  successfully loaded the weights of {} from its {} files ({} "
        "tensor-parallel rank(s) × {} pipeline stages), assembled whole\n",
        directory.string(), source.tensor_parallel * source.pipeline_parallel,
        source.tensor_parallel, source.pipeline_parallel);
  }
  out.flush();
  return model;
}

int64_t divisor_keeping_padding(int64_t vocab_size, int64_t padded_vocab_size, int64_t divisor,
                                int64_t from_tensor_parallel, int64_t tensor_parallel) {
  auto keeps = [&](int64_t candidate) {
    return candidate > 0 &&
           backend::padded_vocab_size(vocab_size, candidate, tensor_parallel) == padded_vocab_size;
  };
  if ((divisor * from_tensor_parallel) % tensor_parallel == 0 &&
      keeps(divisor * from_tensor_parallel / tensor_parallel)) {
    return divisor * from_tensor_parallel / tensor_parallel;
  }
  if (padded_vocab_size % tensor_parallel == 0 && keeps(padded_vocab_size / tensor_parallel)) {
    return padded_vocab_size / tensor_parallel;
  }
  return 0;
}

ReshardResult reshard_checkpoint(const ReshardOptions& options, std::ostream& out) {
  const int64_t target_tp = options.target_tensor_parallel;
  const int64_t target_pp = options.target_pipeline_parallel;
  if (target_tp < 1) {
    common::fail("--target-tensor-parallel-size must be at least 1, got {}", target_tp);
  }
  if (target_pp < 1) {
    common::fail("--target-pipeline-parallel-size must be at least 1, got {}", target_pp);
  }
  if (same_directory(options.load, options.save)) {
    common::fail(
        "--save {} is the --load directory: resharding writes a new checkpoint beside "
        "the original; pass another --save",
        options.save.string());
  }

  // Read and check everything the source says before anything is written.
  Source source = open_source(options.load);
  const ShardFile& first = *source.readers.front();
  if (source.tracked.release) {
    out << fmt::format(" loading release checkpoint from {}\n", options.load.string());
  } else {
    out << fmt::format(" loading checkpoint from {} at iteration {}\n", options.load.string(),
                       source.tracked.iteration);
  }
  const int64_t num_layers = source.arguments.model.num_layers;
  if (num_layers % target_pp != 0) {
    common::fail(
        "--target-pipeline-parallel-size {} does not divide the {} layers of the model "
        "of {} (--num-layers {}): every pipeline stage holds the same number of layers; "
        "valid sizes: {}",
        target_pp, num_layers, first.path().string(), num_layers, divisors_text(num_layers));
  }
  CheckpointModelRecord target_arguments = source.arguments;
  target_arguments.parallelism.tensor_model_parallel_size = target_tp;
  target_arguments.parallelism.pipeline_model_parallel_size = target_pp;
  // The interleaved schedule's chunk size is kept where the trainer takes it at the target size.
  const int64_t source_per_virtual_stage =
      source.arguments.parallelism.num_layers_per_virtual_pipeline_stage;
  const std::string interleaving =
      interleaving_problem(num_layers, target_pp, source_per_virtual_stage);
  if (!interleaving.empty()) target_arguments.parallelism.num_layers_per_virtual_pipeline_stage = 0;
  if (options.make_vocab_size_divisible_by > 0) {
    target_arguments.model.make_vocab_size_divisible_by = options.make_vocab_size_divisible_by;
  }
  const GptConfig target_config = model_config(target_arguments);
  try {
    check_tensor_parallel(target_config, target_tp);
  } catch (const common::Error& error) {
    common::fail(
        "--target-tensor-parallel-size {}: the model of {} cannot be split over {} "
        "ranks: {}",
        target_tp, first.path().string(), target_tp, error.what());
  }
  const ParameterLayout source_whole(source.config);
  const ParameterLayout target_whole(target_config);
  check_vocabulary_change(source_whole, target_whole, target_config, first.path());

  GptConfig largest = source.config;
  largest.padded_vocab_size =
      std::max(source.config.padded_vocab_size, target_config.padded_vocab_size);
  common::require_memory_fits(
      common::estimate_reshard_memory(model_shape(largest), source.optimizer_state, target_tp),
      common::available_memory(),
      fmt::format("resharding {}: the model its arguments describe", first.path().string()),
      "Reshard it on a machine with more memory.");

  // One writer in OUT from here on, and no checkpoint there to replace.
  const common::ExclusiveFileLock save_lock = lock_save_directory(options.save);
  if (const auto existing = read_checkpoint_tracker(options.save)) {
    common::fail(
        "--save {} holds a checkpoint already (its tracker {} names {}): resharding "
        "writes a new checkpoint directory; pass an empty or new --save",
        options.save.string(), checkpoint_tracker_path(options.save).string(),
        existing->release ? std::string("release")
                          : fmt::format("iteration {}", existing->iteration));
  }

  if (source.pipeline_parallel == 1 && target_pp == 1) {
    out << fmt::format(" > resharding from tensor-parallel size {} to {}", source.tensor_parallel,
                       target_tp);
  } else {
    out << fmt::format(
        " > resharding from tensor-parallel size {}, pipeline-parallel size {} to "
        "tensor-parallel size {}, pipeline-parallel size {}",
        source.tensor_parallel, source.pipeline_parallel, target_tp, target_pp);
  }
  if (source.optimizer_state) {
    out << " (parameters and optimizer state)\n";
  } else if (source.optimizer_not_read.empty()) {
    out << " (parameters; the checkpoint has no optimizer state)\n";
  } else {
    out << fmt::format(" (parameters; no optimizer state: {})\n", source.optimizer_not_read);
  }
  if (!interleaving.empty()) {
    out << fmt::format(
        " > --num-layers-per-virtual-pipeline-stage {} of the checkpoint does not "
        "fit --target-pipeline-parallel-size {} ({}): the resharded checkpoint has "
        "no interleaved schedule (num_layers_per_virtual_pipeline_stage 0); resume "
        "without --num-layers-per-virtual-pipeline-stage\n",
        source_per_virtual_stage, target_pp, interleaving);
  }
  const int64_t source_rows = source.config.padded_vocab_size;
  const int64_t target_rows = target_config.padded_vocab_size;
  const int64_t keeping = divisor_keeping_padding(
      source.config.vocab_size, source_rows, source.arguments.model.make_vocab_size_divisible_by,
      source.tensor_parallel, target_tp);
  if (target_rows != source_rows) {
    out << fmt::format(
        " > padded vocabulary: {} rows at tensor-parallel size {} (--make-vocab-size-divisible-by "
        "{}), {} at {} (--make-vocab-size-divisible-by {}): {}{}\n",
        source_rows, source.tensor_parallel, source.arguments.model.make_vocab_size_divisible_by,
        target_rows, target_tp, target_arguments.model.make_vocab_size_divisible_by,
        target_rows < source_rows
            ? fmt::format("padding rows {}..{} dropped", target_rows, source_rows - 1)
            : fmt::format("rows {}..{} added as copies of row {} (weights and moments, as "
                          "Megatron's saver pads)",
                          source_rows, target_rows - 1, source_rows - 1),
        keeping > 0
            ? fmt::format("; --make-vocab-size-divisible-by {} keeps {} rows", keeping, source_rows)
            : std::string());
  }
  out.flush();

  const WholeState state = assemble(source, source_whole, true);
  const json metadata =
      target_metadata(first.metadata(), source, target_config, target_arguments, options);
  std::vector<float> storage;
  const int64_t target_chunks = target_arguments.parallelism.virtual_pipeline_chunks(num_layers);
  write_checkpoint_files(
      options.save, source.tracked.iteration, source.tracked.release, target_tp, target_pp,
      [&](int64_t rank, int64_t stage) {
        json file_metadata = metadata;
        file_metadata["tensor_parallel"] = {{"size", target_tp}, {"rank", rank}};
        file_metadata["pipeline_parallel"] = {{"size", target_pp}, {"rank", stage}};
        return target_rank_file(
            state, source_whole, target_config, target_tp, rank,
            {.pipeline_parallel = target_pp, .rank = stage, .virtual_chunks = target_chunks},
            source.optimizer_state, file_metadata, storage);
      },
      out, options.megatron);

  ReshardResult result;
  result.iteration = source.tracked.iteration;
  result.release = source.tracked.release;
  result.source_tensor_parallel = source.tensor_parallel;
  result.source_pipeline_parallel = source.pipeline_parallel;
  result.source_layers_per_virtual_stage = source_per_virtual_stage;
  result.interleaving_dropped = !interleaving.empty();
  result.source_padded_vocab_size = source_rows;
  result.target_padded_vocab_size = target_rows;
  result.divisor_keeping_padding = keeping;
  result.optimizer_state = source.optimizer_state;
  result.optimizer_not_read = source.optimizer_not_read;
  result.rng_state = first.metadata().contains("rng_state");
  result.target_arguments = target_arguments;
  return result;
}

}  // namespace backend
