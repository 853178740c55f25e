// The conversion stage: checkpoint_util --load <checkpoint folder> --export-hf <results>/hf
// --export-nemo <results>/<conversion.run.nemo_file_name> [--vocab-file
// <conversion.model.vocab_file> --merge-file <conversion.model.merge_file>]: NeMo's
// megatron_gpt.nemo with the tokenizer's files packed in, as NeMo's converter writes it, and a
// Hugging Face directory besides.
#pragma once

#include <optional>

#include "launcher/stages/stage.hpp"

namespace launcher {

std::optional<JobSpec> build_conversion_job(const StageContext& context);

}  // namespace launcher
