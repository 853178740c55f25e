// OmegaConf merge semantics; see merge.hpp.
#include "launcher/config/merge.hpp"

namespace launcher {

void merge_into(Node& destination, const Node& source) {
  if (!destination.is_map() || !source.is_map()) {
    if (source.is_missing() && !destination.is_null()) return;
    destination = source;
    return;
  }
  for (const auto& entry : source.entries()) {
    Node* existing = destination.child(entry.key);
    if (existing == nullptr) {
      destination.entries().push_back(entry);
    } else if (entry.value.is_missing()) {
      continue;  // "???" keeps what is already there
    } else if (existing->is_map() && entry.value.is_map()) {
      merge_into(*existing, entry.value);
    } else {
      *existing = entry.value;
    }
  }
}

}  // namespace launcher
