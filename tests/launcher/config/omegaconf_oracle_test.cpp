// Compares our YAML typing, merging, overrides and interpolation with the real OmegaConf
// (Debian's python3-omegaconf, 2.2) on a small table of cases. Skips itself with a message
// when no python3 on this machine can import omegaconf.
//
// Each case: YAML documents merged in order (OmegaConf.merge), then key=value overrides
// (OmegaConf.update(merge=True) with the value typed by OmegaConf's YAML loader; the table only
// uses values that Hydra's grammar types the same way), then OmegaConf.to_container(resolve=
// True). Both sides print one line per leaf: path, Python type name, and repr (JSON for
// strings), and the lines must match exactly.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "backend/common/error.hpp"
#include "launcher/config/interpolate.hpp"
#include "launcher/config/merge.hpp"
#include "launcher/config/overrides.hpp"
#include "launcher/config/yaml_io.hpp"

using launcher::Node;

namespace {

struct OracleCase {
  std::string name;
  std::vector<std::string> documents;
  std::vector<std::string> overrides;
};

const std::vector<OracleCase>& oracle_cases() {
  static const std::vector<OracleCase> cases = {
      {"scalar typing",
       {"a: 1e-5\nb: 6e-4\nc: 1_000\nd: 0x1F\ne: yes\nf: 'yes'\ng: ~\nh: 1:30\ni: .inf\nj: "
        "2023-01-01\n"
        "k: 017\nl: +7\nm: 1.\nn: abc\no: 1.5e3\np: -.5\nq: 'null'\nr: Off\ns: 0b101\nt: \"1\"\n"
        "u: 1:30.5\nv: -.INF\nw: 08\nx: 12:61\ny: é\n"},
       {}},
      {"merge",
       {"a: {x: 1, y: [1, 2], w: {deep: 1}}\nb: 1\nc: 5\nd: {m: 1}\n",
        "a: {y: [3], z: 2, w: {deeper: 2}}\nb: {m: 1}\nc: ???\nd: plain\ne: [x]\n"},
       {}},
      {"interpolation",
       {"model:\n  h: 768\n  ffn: ${multiply:4,${.h}}\n  heads: 12\n  kv: "
        "${divide_floor:${.h},${.heads}}\n"
        "  ceil: ${divide_ceil:7,2}\n  s: ${.h}_${.heads}\n  f: x${lr}\n  scaled: "
        "${multiply:${lr}, 2}\n"
        "lr: 1e-5\nroot: ${model.h}\nrel:\n  a: 1\n  b: ${..model.heads}\n  c: ${.a}\ncp: ${rel}\n"
        "esc: \\${model.h}\nesc2: \\\\${model.h}\nl:\n  - 1\n  - ${model.h}\n  - ${model.s}\n"
        "ref_list: ${l}\nidx: ${l.1}\nbr: ${l[2]}\nsp: ${ model.h }\n"},
       {}},
      {"overrides",
       {"trainer: {max_steps: 10, devices: 8}\nname: x\noptim: {lr: 0.1, betas: [0.9, 0.95]}\n"},
       {"trainer.max_steps=5", "name=gpt3/126m", "trainer.devices=[1, 2]", "optim.lr=6e-4",
        "optim={betas: [0.5]}", "optim.betas.0=0.25"}},
      {"oc.env defaults",
       {"a: ${oc.env:LAUNCHER_ORACLE_UNSET,5}\nb: ${oc.env:LAUNCHER_ORACLE_UNSET,null}\n"
        "c: ${oc.env:LAUNCHER_ORACLE_UNSET,'x y'}\nd: ${oc.env:LAUNCHER_ORACLE_UNSET,true}\n"
        "e: ${oc.env:LAUNCHER_ORACLE_UNSET,1.5}\n"},
       {}},
      {"resolver arguments and escapes",
       {R"Y(a: 3
b: a
q: '${oc.env:LAUNCHER_ORACLE_UNSET,''${a}''}'
l: '${oc.env:LAUNCHER_ORACLE_UNSET,[1, 2]}'
d: '${oc.env:LAUNCHER_ORACLE_UNSET,{x: 1, y: [a]}}'
e: '${oc.env:LAUNCHER_ORACLE_UNSET, a b }'
esc: '${oc.env:LAUNCHER_ORACLE_UNSET,a\,b}'
cat: ${a}${a}
qs: '${oc.env:LAUNCHER_ORACLE_UNSET,"x\"y"}'
bs: '${oc.env:LAUNCHER_ORACLE_UNSET,''a\\''}'
bsi: '${oc.env:LAUNCHER_ORACLE_UNSET,''\\${a}''}'
bsi2: '${oc.env:LAUNCHER_ORACLE_UNSET,''\${a}''}'
mid: '${oc.env:LAUNCHER_ORACLE_UNSET,''a\b''}'
t: '${oc.env:LAUNCHER_ORACLE_UNSET,abc:def}'
top_bs: 'a\\${a}'
top_bs_end: 'a\\'
top_dollar: '$a ${a}'
nested_key: ${${b}}
dict_arg: '${oc.env:LAUNCHER_ORACLE_UNSET,{k: ${a}}}'
empty_arg: ${oc.env:LAUNCHER_ORACLE_UNSET,}
float_arg: ${oc.env:LAUNCHER_ORACLE_UNSET,1e-3}
int_arg: ${oc.env:LAUNCHER_ORACLE_UNSET,1_000}
bool_arg: ${oc.env:LAUNCHER_ORACLE_UNSET,TRUE}
)Y"},
       {}},
      {"string formatting",
       {"f: 1e-16\ng: 100.0\nh: 0.1\nt: true\nn: null\ns: ${f}_${g}_${h}_${t}_${n}\nd: {k: v, q: "
        "\"it's\"}\n"
        "ds: x${d}\nli: [1, a, 2.5, null]\nls: x${li}\nbig: 12345678901234567890.0\nbs: ${big}!\n"
        "neg: -0.0\nns: ${neg}\n"},
       {}},
  };
  return cases;
}

// The Python side; prints "----" after each case, "ERROR <message>" if a case fails.
constexpr const char* kOracleScript = R"PY(
import json, math, sys
import yaml
from omegaconf import OmegaConf
from omegaconf._utils import get_yaml_loader

OmegaConf.register_new_resolver("multiply", lambda x, y: x * y, replace=True)
OmegaConf.register_new_resolver("divide_ceil", lambda x, y: int(math.ceil(x / y)), replace=True)
OmegaConf.register_new_resolver("divide_floor", lambda x, y: int(math.floor(x / y)), replace=True)

def leaves(value, path, out):
    if isinstance(value, dict):
        if not value:
            out.append(f"{path}\tdict\t{{}}")
        for key, item in value.items():
            leaves(item, f"{path}.{key}" if path else str(key), out)
    elif isinstance(value, list):
        if not value:
            out.append(f"{path}\tlist\t[]")
        for index, item in enumerate(value):
            leaves(item, f"{path}.{index}" if path else str(index), out)
    else:
        text = json.dumps(value) if isinstance(value, str) else repr(value)
        out.append(f"{path}\t{type(value).__name__}\t{text}")

for case in json.load(open(sys.argv[1])):
    try:
        config = OmegaConf.create(case["documents"][0])
        for document in case["documents"][1:]:
            config = OmegaConf.merge(config, OmegaConf.create(document))
        for override in case["overrides"]:
            key, value = override.split("=", 1)
            OmegaConf.update(config, key, yaml.load(value, Loader=get_yaml_loader()), merge=True)
        out = []
        leaves(OmegaConf.to_container(config, resolve=True), "", out)
        print("\n".join(out))
    except Exception as error:
        print("ERROR", type(error).__name__, str(error).replace("\n", " "))
    print("----")
)PY";

std::string python_type_name(const Node& node) {
  switch (node.kind()) {
    case launcher::NodeKind::Null:
      return "NoneType";
    case launcher::NodeKind::Bool:
      return "bool";
    case launcher::NodeKind::Int:
      return "int";
    case launcher::NodeKind::Float:
      return "float";
    case launcher::NodeKind::String:
      return "str";
    case launcher::NodeKind::List:
      return "list";
    case launcher::NodeKind::Map:
      return "dict";
  }
  return "?";
}

void leaves(const Node& node, const std::string& path, std::vector<std::string>& out) {
  auto child_path = [&path](const std::string& key) {
    return path.empty() ? key : path + "." + key;
  };
  if (node.is_map()) {
    if (node.size() == 0) out.push_back(path + "\tdict\t{}");
    for (const auto& entry : node.entries()) leaves(entry.value, child_path(entry.key), out);
  } else if (node.is_list()) {
    if (node.size() == 0) out.push_back(path + "\tlist\t[]");
    for (std::size_t i = 0; i < node.size(); ++i)
      leaves(node.items()[i], child_path(std::to_string(i)), out);
  } else {
    const std::string text = node.is_string() ? nlohmann::json(node.as_string()).dump(-1, ' ', true)
                                              : launcher::python_str(node);
    out.push_back(path + "\t" + python_type_name(node) + "\t" + text);
  }
}

std::string ours(const OracleCase& item) {
  try {
    Node config = launcher::parse_yaml(item.documents[0], "oracle.yaml");
    for (std::size_t i = 1; i < item.documents.size(); ++i) {
      launcher::merge_into(config, launcher::parse_yaml(item.documents[i], "oracle.yaml"));
    }
    for (const auto& text : item.overrides)
      launcher::apply_override(config, launcher::parse_override(text));
    std::vector<std::string> out;
    leaves(launcher::resolve(config, {}), "", out);
    std::string joined;
    for (const auto& line : out) joined += (joined.empty() ? "" : "\n") + line;
    return joined;
  } catch (const common::Error& error) {
    return std::string("ERROR ") + error.what();
  }
}

std::string python_with_omegaconf() {
  for (const char* candidate : {"python3", "/usr/bin/python3"}) {
    const std::string command = std::string(candidate) + " -c 'import omegaconf' >/dev/null 2>&1";
    if (std::system(command.c_str()) == 0) return candidate;
  }
  return "";
}

}  // namespace

TEST_CASE("OmegaConf oracle: typing, merge, overrides and interpolation match python3-omegaconf") {
  const std::string python = python_with_omegaconf();
  if (python.empty()) {
    MESSAGE(
        "OmegaConf oracle test skipped: python3-omegaconf not installed (apt-get install "
        "python3-omegaconf)");
    return;
  }
  unsetenv("LAUNCHER_ORACLE_UNSET");
  const auto directory = std::filesystem::temp_directory_path() / "launcher_omegaconf_oracle";
  std::filesystem::create_directories(directory);
  nlohmann::json cases = nlohmann::json::array();
  for (const auto& item : oracle_cases()) {
    cases.push_back({{"documents", item.documents}, {"overrides", item.overrides}});
  }
  std::ofstream(directory / "cases.json") << cases.dump();
  std::ofstream(directory / "oracle.py") << kOracleScript;
  const std::string command = python + " -B -W ignore " + (directory / "oracle.py").string() + " " +
                              (directory / "cases.json").string() + " > " +
                              (directory / "out.txt").string() + " 2>&1";
  REQUIRE(std::system(command.c_str()) == 0);

  std::ifstream output(directory / "out.txt");
  std::vector<std::string> expected;
  std::string current;
  std::string line;
  while (std::getline(output, line)) {
    if (line == "----") {
      expected.push_back(current);
      current.clear();
    } else {
      current += (current.empty() ? "" : "\n") + line;
    }
  }
  REQUIRE(expected.size() == oracle_cases().size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    CAPTURE(oracle_cases()[i].name);
    CHECK(ours(oracle_cases()[i]) == expected[i]);
  }
}
