// The data_preparation stage, in one of two shapes chosen by the keys of its section:
//  - `input` (conf/data_preparation/gpt3/preprocess.yaml): local JSONL files → one
//    preprocess_data job with Megatron's tools/preprocess_data.py flags;
//  - `file_urls` (conf/data_preparation/gpt3/download_and_preprocess.yaml): one shard per URL,
//    three steps, each its own job, each a job array when it has several files:
//      download    the shards and the tokenizer's vocab/merges (`download`, one task each)
//      decompress  the .gz/.zst/.xz shards (`decompress`, one task each; `decompress: false`
//                  leaves it out, preprocess_data reading compressed shards itself)
//      preprocess  one preprocess_data per shard → <output_prefix>[_NN]_<key>_document
//    each after the one before with afterok (a step without its input is pointless), and the
//    stage after data_preparation (training) after the last, also with afterok.
//  - `the_pile_url`/`file_numbers` (NeMo's own download_<model>_pile.yaml, unchanged): the
//    Pile's shards NN.jsonl.zst under the_pile_url, in NeMo's three sub-stages and with its
//    file names: download (the shards, and download_vocab_url/download_merges_url into
//    vocab_save_dir/merges_save_dir), extract (`decompress`, --remove-input with
//    rm_downloaded) and preprocess (preprocess_data → ${data_dir}/my-<model type>_NN,
//    --remove-input with rm_extracted); download_the_pile and preprocess_data leave steps
//    out; run.node_array_size caps the tasks running at once (NeMo's --array=...%N).
// Nothing to submit (no input, no URLs): no job, and the chain continues from the stage before.
//
// The training stage picks the outputs up through `data_preparation.data_prefix`: left null
// (or `???`) in the section, the launcher fills it with the blend list of what the stage produces,
// [1.0, <prefix of shard 0>, 1.0, <prefix of shard 1>, ...] (equal weights, as NeMo's Pile
// configs write them), so `training.model.data.data_prefix=${data_preparation.data_prefix}`
// trains on it.
#pragma once

#include <string>
#include <vector>

#include "launcher/config/compose.hpp"
#include "launcher/stages/stage.hpp"

namespace launcher {

std::vector<JobSpec> build_data_preparation_jobs(const StageContext& context);

// What the download shape will produce, from the resolved `data_preparation` section: per
// shard its URL, checksum, download path, the file preprocess_data reads, and the output
// prefix (preprocess_data's --output-prefix; the dataset is <prefix>_<key>_document).
struct ShardPlan {
  std::string url;
  std::string sha256;  // empty: not verified
  std::string download_path;
  bool decompressed = false;  // a decompress task turns download_path into input_path
  std::string input_path;
  std::string output_prefix;
};
std::vector<ShardPlan> plan_shards(const Node& data_preparation);

// The blend list the section's outputs make (see above); empty when the section has neither
// `input` nor `file_urls` entries.
Node data_preparation_blend(const Node& data_preparation);

// Fills `data_preparation.data_prefix` of a composed (unresolved) config when its value is
// null or `???`, from a resolved copy of the config. Does nothing when the key is absent or set, or
// when the copy does not resolve (the launch's own resolve then reports why).
void fill_data_preparation_blend(ComposedConfig& composed);

}  // namespace launcher
