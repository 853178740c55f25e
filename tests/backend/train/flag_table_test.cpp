// A concern's flag table (flag_table.hpp): the CLI11 options its rows make (a switch for a bool,
// one or more words for a list, a required flag refused when missing, the shape flags handed
// back, --help's default text, an enum by its names), and the arguments-dump lines they print,
// as Megatron's dump prints those values.
#include "backend/train/flag_table.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

struct ExampleConcern {
  bool enabled = false;
  int64_t count = 3;
  int64_t limit = 0;
  double ratio = 0.5;
  std::string name;
  std::string label = "plain";
  std::vector<std::string> files;
};

const backend::FlagRow<ExampleConcern> kExampleFlags[] = {
    {"--enabled", &ExampleConcern::enabled, "a switch", "enabled"},
    {"--count,--old-count", &ExampleConcern::count, "a number", "count"},
    {"--limit", &ExampleConcern::limit, "a number or none", "limit",
     backend::FlagDump::none_if_not_positive},
    {"--ratio", &ExampleConcern::ratio, "a fraction", "ratio"},
    {"--name", &ExampleConcern::name, "a path or none", "name", backend::FlagDump::none_if_empty},
    {"--label", &ExampleConcern::label, "a string", "label"},
    {"--files", &ExampleConcern::files, "one or more words", "files", backend::FlagDump::value,
     backend::FlagRequirement::required},
    {"--undumped", &ExampleConcern::limit, "set, never dumped"},
};

// A concern parsed from `words` by its table's options, and its table's dump lines.
template <typename Concern>
Concern parse_rows(std::span<const backend::FlagRow<Concern>> rows,
                   std::vector<std::string> words) {
  Concern concern;
  CLI::App app{"example"};
  backend::add_flag_rows<Concern>(app, concern, rows, "Example");
  std::vector<const char*> argv{"example"};
  for (const std::string& word : words) argv.push_back(word.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
  return concern;
}

template <typename Concern>
std::map<std::string, std::string> dump_rows(std::span<const backend::FlagRow<Concern>> rows,
                                             const Concern& concern) {
  std::map<std::string, std::string> values;
  backend::dump_flag_rows<Concern>(concern, rows, values);
  return values;
}

ExampleConcern parse_example(std::vector<std::string> words) {
  return parse_rows<ExampleConcern>(kExampleFlags, std::move(words));
}

std::map<std::string, std::string> dump_example(const ExampleConcern& concern) {
  return dump_rows<ExampleConcern>(kExampleFlags, concern);
}

}  // namespace

TEST_CASE("a flag table's rows become the options, every spelling setting its field") {
  const ExampleConcern parsed =
      parse_example({"--enabled", "--old-count", "7", "--ratio", "0.25", "--name", "n",
                     "--files", "a", "b", "--label", "x"});
  CHECK(parsed.enabled);
  CHECK(parsed.count == 7);
  CHECK(parsed.ratio == 0.25);
  CHECK(parsed.name == "n");
  CHECK(parsed.label == "x");
  CHECK(parsed.files == std::vector<std::string>{"a", "b"});
  CHECK_THROWS_AS(parse_example({"--enabled"}), CLI::RequiredError);  // --files is required
  CHECK(parse_example({"--files", "f"}).files == std::vector<std::string>{"f"});
  CHECK(parse_example({"--files", "f", "--undumped", "9"}).limit == 9);
}

TEST_CASE("a flag table's dump prints Python's str() of Megatron's values") {
  ExampleConcern concern;
  auto values = dump_example(concern);
  CHECK(values == std::map<std::string, std::string>{{"enabled", "False"},
                                                     {"count", "3"},
                                                     {"limit", "None"},
                                                     {"ratio", "0.5"},
                                                     {"name", "None"},
                                                     {"label", "plain"},
                                                     {"files", "None"}});
  concern.enabled = true;
  concern.limit = 12;
  concern.name = "n";
  concern.label = "";
  concern.files = {"a", "b c"};
  values = dump_example(concern);
  CHECK(values.at("enabled") == "True");
  CHECK(values.at("limit") == "12");
  CHECK(values.at("name") == "n");
  CHECK(values.at("label").empty());
  CHECK(values.at("files") == "['a', 'b c']");
  CHECK_FALSE(values.contains("undumped"));
}

namespace {

struct NumbersConcern {
  std::optional<int64_t> layers;
  std::optional<double> scale;
  std::vector<int64_t> rampup;
  uint64_t seed = 1234;
  double factor = 8.0;
  int64_t width = 0;
};

const backend::FlagRow<NumbersConcern> kNumbersFlags[] = {
    {"--layers", &NumbersConcern::layers, "optional", "layers"},
    {"--scale", &NumbersConcern::scale, "optional", "scale"},
    {.names = "--rampup",
     .field = &NumbersConcern::rampup,
     .help = "three numbers",
     .dump_name = "rampup",
     .words = 3},
    {"--seed", &NumbersConcern::seed, "unsigned", "seed"},
    {"--factor", &NumbersConcern::factor, "as Python prints it", "factor",
     backend::FlagDump::python_float, backend::FlagRequirement::optional, "8.0"},
    {"--width", &NumbersConcern::width, "a shape flag", "width", backend::FlagDump::value,
     backend::FlagRequirement::shape},
};

}  // namespace

TEST_CASE("a flag table's optional, list-of-numbers, unsigned and shape rows") {
  NumbersConcern concern;
  CLI::App app{"numbers"};
  std::vector<CLI::Option*> shape_options;
  backend::add_flag_rows<NumbersConcern>(app, concern, kNumbersFlags, "Numbers", &shape_options);
  REQUIRE(shape_options.size() == 1);
  CHECK(shape_options.front()->get_name() == "--width");
  CHECK(app.get_option("--factor")->get_default_str() == "8.0");  // not CLI11's "8"
  std::map<std::string, std::string> values;
  backend::dump_flag_rows<NumbersConcern>(concern, kNumbersFlags, values);
  CHECK(values.at("layers") == "None");
  CHECK(values.at("scale") == "None");
  CHECK(values.at("rampup") == "None");
  CHECK(values.at("seed") == "1234");
  CHECK(values.at("factor") == "8.0");
  CHECK(values.at("width") == "0");

  const std::vector<const char*> argv{"numbers", "--layers", "4", "--scale", "0.5",
                                      "--rampup", "16", "16", "1000", "--seed", "7",
                                      "--factor", "32", "--width", "64"};
  app.parse(static_cast<int>(argv.size()), argv.data());
  values.clear();
  backend::dump_flag_rows<NumbersConcern>(concern, kNumbersFlags, values);
  CHECK(values.at("layers") == "4");
  CHECK(values.at("scale") == "0.5");
  CHECK(values.at("rampup") == "['16', '16', '1000']");  // argparse keeps the words
  CHECK(values.at("seed") == "7");
  CHECK(values.at("factor") == "32.0");
  CHECK(values.at("width") == "64");
}

namespace {

enum class Mode { none, fast, exact };
constexpr common::EnumName<Mode> kModeNames[] = {
    {Mode::none, ""}, {Mode::fast, "Fast"}, {Mode::exact, "Exact"}, {Mode::fast, "fast"}};
constexpr std::span<const common::EnumName<Mode>> enum_names(Mode) { return kModeNames; }

struct ModeConcern {
  Mode mode = Mode::none;
  std::optional<Mode> fallback;
};

const backend::FlagRow<ModeConcern> kModeFlags[] = {
    {"--mode", backend::enum_flag_field<&ModeConcern::mode>(), "an enum", "mode",
     backend::FlagDump::none_if_empty},
    {"--fallback", backend::enum_flag_field<&ModeConcern::fallback>(), "an optional enum",
     "fallback", backend::FlagDump::none_if_empty},
};

ModeConcern parse_modes(std::vector<std::string> words) {
  return parse_rows<ModeConcern>(kModeFlags, std::move(words));
}

std::map<std::string, std::string> dump_modes(const ModeConcern& concern) {
  return dump_rows<ModeConcern>(kModeFlags, concern);
}

}  // namespace

TEST_CASE("an enum row takes the enum's names and dumps the value's first name") {
  const ModeConcern unset = parse_modes({});
  CHECK(unset.mode == Mode::none);
  CHECK_FALSE(unset.fallback);
  CHECK(dump_modes(unset) == std::map<std::string, std::string>{{"mode", "None"},
                                                                 {"fallback", "None"}});
  const ModeConcern given = parse_modes({"--mode", "fast", "--fallback", "Exact"});
  CHECK(given.mode == Mode::fast);
  CHECK(given.fallback == Mode::exact);
  CHECK(dump_modes(given) == std::map<std::string, std::string>{{"mode", "Fast"},
                                                                 {"fallback", "Exact"}});
  // A name outside the table is CLI11's conversion error (pretrain_gpt's value rules refuse it
  // first, naming the choices).
  CHECK_THROWS_AS(parse_modes({"--mode", "slow"}), CLI::ConversionError);
  CHECK_THROWS_AS(parse_modes({"--mode"}), CLI::ArgumentMismatch);
}

TEST_CASE("an enum flag's shared rule lists exactly its enum's names, or the option is not made") {
  // The rule's order need not be the enum's.
  CHECK_NOTHROW(backend::check_enum_choices("--normalization",
                                            {"rmsnorm", "LayerNorm", "RMSNorm", "layernorm"}));
  // A name the rule lacks, or one it has beyond the enum's, is this program's bug.
  CHECK_THROWS_WITH_AS(backend::check_enum_choices("--normalization,--norm", {"LayerNorm"}),
                       "--normalization: its rule in common/flag_rules.cpp takes LayerNorm, "
                       "RMSNorm, layernorm, rmsnorm but its enum's names are LayerNorm",
                       std::logic_error);
  CHECK_THROWS_WITH_AS(backend::check_enum_choices("--data-path", {"a"}),
                       doctest::Contains("takes no list of choices"), std::logic_error);
  // A flag without a rule (this file's --mode) is not checked.
  CHECK_NOTHROW(backend::check_enum_choices("--mode", {"Fast"}));
  // pretrain_gpt's, evaluate_gpt's and the server's enum flags pass whenever arguments_test.cpp
  // parses a command line of theirs.
}
