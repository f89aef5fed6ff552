// The cluster file's parser (`run --cluster FILE`; its format in
// actors/remote.hpp), apart from the daemon connection code so that the
// fuzzer fuzz/cluster_file.cpp compiles it without the CAF-heavy rest of
// actors/remote.cpp.
#include "actors/remote.hpp"

#include "topologies/profile.hpp"

#include <nlohmann/json.hpp>

namespace cellshard::actors {

result<std::vector<remote_node>> parse_cluster_json(const std::string& text, const std::string& name) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    return make_error(name + ": not valid JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains("nodes") || !j["nodes"].is_array())
    return make_error(name + ": expected {\"nodes\": [{\"host\": ..., \"port\": ...}, ...]}");
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "nodes") return make_error(name + ": unknown key \"" + it.key() + "\" (expected \"nodes\")");
  std::vector<remote_node> out;
  int i = 0;
  for (const auto& n : j["nodes"]) {
    const std::string where = name + ": nodes[" + std::to_string(i++) + "]";
    if (!n.is_object()) return make_error(where + ": expected an object");
    remote_node r;
    for (auto it = n.begin(); it != n.end(); ++it) {
      const std::string& k = it.key();
      const auto& v = it.value();
      if (k == "host") {
        if (!v.is_string() || v.get<std::string>().empty()) return make_error(where + ".host: expected a host name");
        r.host = v.get<std::string>();
      } else if (k == "port") {
        if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > 65535)
          return make_error(where + ".port: expected an integer in [1, 65535]");
        r.port = static_cast<uint16_t>(v.get<int64_t>());
      } else if (k == "profile") {
        if (!v.is_string()) return make_error(where + ".profile: expected a string");
        auto p = topologies::find_profile(v.get<std::string>());
        if (!p) return make_error(where + ".profile: " + p.message());
        r.profile = v.get<std::string>();
      } else if (k == "spare") {
        if (!v.is_boolean()) return make_error(where + ".spare: expected true or false");
        r.spare = v.get<bool>();
      } else if (k == "memory") {
        if (v.is_number_unsigned() && v.get<uint64_t>() > 0) {
          r.memory = v.get<uint64_t>();
        } else if (v.is_string()) {
          auto m = topologies::parse_memory(v.get<std::string>());
          if (!m) return make_error(where + ".memory: " + m.message());
          r.memory = *m;
        } else {
          return make_error(where + ".memory: expected bytes or a size such as \"256MiB\"");
        }
      } else {
        return make_error(where + ": unknown key \"" + k + "\" (host, port, profile, spare, memory)");
      }
    }
    if (r.host.empty()) return make_error(where + ": \"host\" is missing");
    if (r.port == 0) return make_error(where + ": \"port\" is missing");
    out.push_back(std::move(r));
  }
  if (out.empty()) return make_error(name + ": \"nodes\" is empty");
  // One daemon is one node: listed twice it would be two nodes sharing one
  // memory budget and failing together.
  for (size_t i = 0; i < out.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (out[i].host == out[j].host && out[i].port == out[j].port)
        return make_error(name + ": nodes[" + std::to_string(i) + "] and nodes[" + std::to_string(j) +
                          "] are the same daemon (" + out[i].address() + "); list each node once");
  return out;
}

}  // namespace cellshard::actors
