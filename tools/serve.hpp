// tools/serve.hpp: pieces of `cellshard serve` that `bench serve` reuses.
#pragma once

#include "actors/cluster.hpp"
#include "serve/server.hpp"
#include "actors/local_daemons.hpp"

#include <string>

namespace cellshard::tools {

/// The model id OpenAI clients name: the file's name without its extension.
std::string model_id_of(const std::string& path);

/// What a "crash"/"freeze" of node N means: with local daemons, SIGKILL or
/// SIGSTOP of daemon N's process; in process, a crash or a silence (for ever)
/// of every shard on node N at its next step (cluster::inject). Both
/// pointers must outlive the returned function.
serve::fault_action node_fault_action(actors::local_daemons* daemons, actors::cluster* cluster);

}  // namespace cellshard::tools
