// `cellshard sweep`: a grid of runs (nodes x topology x link x batch) written
// to DIR/sweep.csv (the columns of CLI.md, then `reduce`: the tensor groups'
// all-reduce algorithm, --reduce direct,scatter; then the decode-only
// figures the planner predicts (issue #25): `decode_tokens_per_s`, run.c's
// achieved tok/s (tokens after each session's first over the time from the
// end of its first forward pass to its last) summed over the batch's common
// decode window (actors::decode_tokens_per_s), and `decode_comm_share`, 1 -
// kernel time / time over each session's decode, the mean over the batch
// (actors::decode_comm_share); `tokens_per_s` stays all tokens over the
// wall time from the submits, first token and stalls included, and
// `comm_share` the first session's over its whole run) and drawn as PNG plots with
// gnuplot: latency, throughput and communication share against node count,
// one line per topology (and reduce), link and batch. The nodes are in-process, or with
// --cluster the first N daemons of a cluster file for a point of N nodes
// (issue #25: calibration over the lab's shaped links; the links are the
// daemons', so --cluster-link only names them in the CSV). Topology
// "expert" is the runtime's expert placement on all N nodes (expert:N-1). Points the model
// cannot be split into (more stages than layers, a tensor group wider than
// the KV heads) are skipped and listed; points whose run failed are listed
// too, and the sweep then exits 1.
#include "actors/cluster.hpp"
#include "actors/remote.hpp"
#include "actors/run_report.hpp"
#include "base/percentile.hpp"
#include "tools/commands.hpp"
#include "tools/common.hpp"
#include "topologies/profile.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <sys/stat.h>

namespace cellshard::tools {

namespace {

struct sweep_opts {
  std::string model, tokenizer, prompt, profile = "host", out = "sweep", json_out;
  int steps = 32;
  float temperature = 0.0f, topp = 0.9f;
  unsigned long long seed = 1;
  std::vector<int> nodes = {1, 2, 4, 8};
  std::vector<std::string> topologies = {"pipeline", "tensor"};
  // --reduce: tensor groups' all-reduce, one point per algorithm (pipelines
  // have none: one point, "direct").
  std::vector<std::string> reduces = {"direct"};
  std::vector<std::string> links = {"none"};
  std::vector<int> batches = {1};
  bool no_plots = false;
  int ctx = 0;  // --ctx (0: the file's context length)
  std::string cluster;       // --cluster FILE: daemons instead of in-process nodes
  std::string cluster_link;  // --cluster-link: the daemons' links as the CSV's link column
  std::string tls_cert, tls_key, tls_ca;
};

void progress(int done, int total, const std::string& what) {
  const int width = 30;
  const int filled = total ? done * width / total : width;
  std::fprintf(stderr, "\r[%s%s] %d/%d %-50s", std::string(filled, '=').c_str(),
               std::string(width - filled, ' ').c_str(), done, total, what.c_str());
  if (done == total) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

/// One gnuplot PNG: column `ycol` of sweep.csv against nodes, a line per series.
void plot(const std::string& dir, const std::string& name, const std::string& title, const std::string& ylabel,
          int ycol, const std::vector<std::string>& series, bool logy) {
  std::ostringstream gp;
  gp << "set terminal pngcairo size 900,560 noenhanced\nset output '" << dir << "/" << name << ".png'\n"
     << "set datafile separator ','\nset key outside right\nset grid\nset logscale x 2\n"
     << (logy ? "set logscale y\n" : "") << "set title '" << title << "'\nset xlabel 'nodes'\nset ylabel '"
     << ylabel << "'\nplot ";
  for (size_t i = 0; i < series.size(); ++i) {
    // Each series is "topology|link|batch|reduce": rows are filtered with a ternary.
    std::string topo, link, batch, reduce;
    std::istringstream ss(series[i]);
    std::getline(ss, topo, '|');
    std::getline(ss, link, '|');
    std::getline(ss, batch, '|');
    std::getline(ss, reduce, '|');
    gp << (i ? ", " : "") << "'" << dir << "/sweep.csv' every ::1 using "
       << "(strcol(2) eq '" << topo << "' && strcol(6) eq '" << link << "' && strcol(7) eq '" << batch
       << "' && strcol(14) eq '" << reduce << "' ? $3 : 1/0):" << ycol << " with linespoints title '" << topo
       << (topo == "pipeline" ? std::string() : " " + reduce) << " " << link << " batch " << batch << "'";
  }
  gp << "\n";
  const std::string script = dir + "/" + name + ".gp";
  write_text(script, gp.str());
  const std::string cmd = "gnuplot '" + script + "' 2>&1";
  if (std::system(cmd.c_str()) != 0)
    std::fprintf(stderr, "warning: gnuplot failed for %s (is gnuplot installed? scripts/install-deps.sh)\n",
                 script.c_str());
}

int do_sweep(const sweep_opts& o) {
  loaded_model lm = load_model(o.model, o.tokenizer, false, o.ctx);
  const auto& mc = lm.file->cfg();
  if (::mkdir(o.out.c_str(), 0755) != 0 && errno != EEXIST)
    throw cli_error(o.out + ": cannot create: " + std::strerror(errno));
  std::fprintf(stderr, "model: %s (%s)\n", lm.description.c_str(), mc.to_string().c_str());
  model::generation_params gp;
  gp.prompt = o.prompt;
  gp.steps = o.steps;
  gp.sampling = {o.temperature, o.topp, o.seed};
  gp = model::normalise(gp, mc.seq_len);

  // --cluster: the daemons, and the first N of them for a point of N nodes.
  std::vector<actors::remote_node> daemons;
  actors::remote_options ro;
  std::vector<std::string> links = o.links;
  if (!o.cluster.empty()) {
    auto nodes = actors::parse_cluster_json(read_text(o.cluster), o.cluster);
    if (!nodes) throw cli_error(nodes.message(), 2);
    daemons = *nodes;
    const int most = *std::max_element(o.nodes.begin(), o.nodes.end());
    if (most > static_cast<int>(daemons.size()))
      throw cli_error("--nodes " + std::to_string(most) + ": " + o.cluster + " lists only " +
                          std::to_string(daemons.size()) + " node(s)",
                      2);
    ro.net.tls = {o.tls_cert, o.tls_key, o.tls_ca};
    ro.default_profile = o.profile;
    if (!o.cluster_link.empty() && o.cluster_link != "none") {
      auto l = topologies::parse_link(o.cluster_link);
      if (!l) throw cli_error("--cluster-link: " + l.message(), 2);
    }
    links = {o.cluster_link.empty() ? "none" : o.cluster_link};
  }

  std::ofstream csv(o.out + "/sweep.csv");
  if (!csv) throw cli_error(o.out + "/sweep.csv: cannot write");
  csv << "model,topology,nodes,stages,tp,link,batch,ttft_ms,tpot_ms_p50,tpot_ms_p99,tokens_per_s,comm_share,"
         "bytes_per_token,reduce,decode_tokens_per_s,decode_comm_share\n";
  const std::string model_name = lm.file->path().substr(lm.file->path().rfind('/') + 1);
  std::vector<std::string> skipped, failed, series;
  nlohmann::json rows = nlohmann::json::array();  // --json: the CSV's rows
  auto reduces_of = [&](const std::string& topo) {
    return topo.rfind("pipeline", 0) == 0 ? std::vector<std::string>{"direct"} : o.reduces;
  };
  int total = 0;
  for (const auto& topo : o.topologies)
    total += static_cast<int>(o.nodes.size() * links.size() * o.batches.size() * reduces_of(topo).size());
  int done = 0;
  for (const auto& topo : o.topologies)
    for (const auto& reduce : reduces_of(topo))
    for (const auto& link : links)
      for (int batch : o.batches) {
        series.push_back(topo + "|" + link + "|" + std::to_string(batch) + "|" + reduce);
        for (int n : o.nodes) {
          const std::string what = topo + " " + std::to_string(n) + " nodes, link " + link + ", batch " +
                                   std::to_string(batch) +
                                   (topo.rfind("pipeline", 0) == 0 ? std::string() : ", reduce " + reduce);
          progress(done, total, what);
          ++done;
          actors::cluster_options co;
          co.file = lm.file;
          co.tok = lm.tok;
          co.ctx = o.ctx;
          co.nodes = n;
          // "expert": the runtime's expert placement on all N nodes (one
          // stage shard and N - 1 expert nodes, expert:N-1).
          if (topo == "expert" && n < 2) {
            skipped.push_back(what + ": expert needs 2 or more nodes (a stage shard and an expert node)");
            continue;
          }
          co.topology = topo == "pipeline" || topo == "tensor" ? topo + ":" + std::to_string(n)
                        : topo == "expert"                     ? "expert:" + std::to_string(n - 1)
                                                               : topo;
          co.profile = o.profile;
          co.reduce = reduce;
          co.link = link == "none" || !daemons.empty() ? "" : link;
          co.sessions = batch;
          if (!daemons.empty()) {
            std::vector<actors::remote_node> first(daemons.begin(), daemons.begin() + n);
            for (auto& d : first) d.spare = false;
            co.host = std::make_shared<actors::remote_host>(std::move(first), ro);
          }
          auto c = actors::cluster::start(co);
          if (!c) {
            skipped.push_back(what + ": " + c.message());
            continue;
          }
          const auto wall0 = std::chrono::steady_clock::now();
          // When each session's tokens arrive (the token callback runs as the
          // session accepts a step's logits): the decode columns.
          struct arrivals {
            std::mutex mu;
            std::vector<std::vector<double>> s;  // per session, seconds since wall0
          };
          auto arr = std::make_shared<arrivals>();
          arr->s.resize(static_cast<size_t>(batch));
          std::vector<std::shared_ptr<std::promise<actors::session_outcome>>> ps;
          for (int b = 0; b < batch; ++b) {
            auto p = std::make_shared<std::promise<actors::session_outcome>>();
            ps.push_back(p);
            (*c)->submit(
                gp,
                [arr, b, wall0](uint64_t, int, const std::string&) {
                  const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
                  std::lock_guard<std::mutex> g(arr->mu);
                  arr->s[static_cast<size_t>(b)].push_back(t);
                },
                [p](uint64_t, const actors::session_outcome& so) { p->set_value(so); });
          }
          std::vector<actors::session_outcome> outs;
          std::string error;
          for (auto& p : ps) {
            auto f = p->get_future();
            if (f.wait_for(std::chrono::minutes(10)) != std::future_status::ready)
              throw cli_error(what + ": a run did not finish within 10 minutes");
            outs.push_back(f.get());
            if (!outs.back().ok && error.empty()) error = outs.back().error;
          }
          // A point whose run failed (e.g. a node lost with no spare) is
          // listed, not written; the sweep goes on and exits 1 at the end.
          if (!error.empty()) {
            failed.push_back(what + ": " + error);
            continue;
          }
          const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
          int tokens = 0;
          for (auto& so : outs) tokens += static_cast<int>(so.result.ids.size()) - 1;
          const auto& first = outs.front();
          auto st = (*c)->stats();
          if (!st) throw cli_error(st.message());
          uint64_t link_bytes = 0;
          for (auto& s : *st)
            for (size_t i = 0; i < s.link_to.size(); ++i)
              if (s.link_to[i] >= 0) link_bytes += s.link_bytes[i];  // between nodes only
          const auto& plan = (*c)->placement();
          const double share = actors::comm_share(first);
          // Decode only (issue #25): run.c's achieved tok/s summed over the
          // batch's common decode window, and the comm share of the same
          // window (the planner predicts these: no first token, no prompt).
          std::vector<std::vector<double>> token_s;
          {
            std::lock_guard<std::mutex> g(arr->mu);
            token_s = arr->s;
          }
          std::vector<double> decode_compute;
          for (auto& so : outs) decode_compute.push_back(so.compute_ms - so.first_step_compute_ms);
          const double decode_tps = actors::decode_tokens_per_s(token_s);
          const double decode_share = actors::decode_comm_share(decode_compute, token_s);
          csv << model_name << "," << topo << "," << n << "," << plan.stages.size() << ","
              << plan.stages.front().shards.size() << "," << link << "," << batch << "," << first.result.ttft_ms
              << "," << percentile(first.result.step_ms, 0.5) << "," << percentile(first.result.step_ms, 0.99) << ","
              << tokens / wall << "," << share << "," << static_cast<double>(link_bytes) / std::max(1, tokens)
              << "," << reduce << "," << decode_tps << "," << decode_share << "\n";
          csv.flush();
          if (!csv) throw cli_error(o.out + "/sweep.csv: write failed: " + std::strerror(errno));
          rows.push_back({{"model", model_name}, {"topology", topo}, {"nodes", n}, {"stages", plan.stages.size()},
                          {"tp", plan.stages.front().shards.size()}, {"link", link}, {"batch", batch},
                          {"ttft_ms", first.result.ttft_ms}, {"tpot_ms_p50", percentile(first.result.step_ms, 0.5)},
                          {"tpot_ms_p99", percentile(first.result.step_ms, 0.99)}, {"tokens_per_s", tokens / wall},
                          {"comm_share", share},
                          {"bytes_per_token", static_cast<double>(link_bytes) / std::max(1, tokens)},
                          {"reduce", reduce}, {"decode_tokens_per_s", decode_tps},
                          {"decode_comm_share", decode_share}});
        }
      }
  progress(total, total, "done");
  csv.close();
  if (!csv) throw cli_error(o.out + "/sweep.csv: write failed: " + std::strerror(errno));
  if (!skipped.empty()) {
    std::fprintf(stderr, "skipped %zu point(s) the model cannot be split into:\n", skipped.size());
    for (auto& s : skipped) std::fprintf(stderr, "  %s\n", s.c_str());
  }
  if (!o.no_plots) {
    plot(o.out, "latency", "time per output token (median)", "ms", 9, series, true);
    plot(o.out, "throughput", "decode tokens per second (aggregate over the batch)", "tokens/s", 15, series, true);
    plot(o.out, "comm_share", "communication share of the decode", "fraction", 16, series, false);
    plot(o.out, "bytes_per_token", "bytes between nodes per token", "bytes", 13, series, false);
  }
  std::fprintf(stderr, "wrote %s/sweep.csv%s\n", o.out.c_str(), o.no_plots ? "" : " and PNG plots");
  if (!o.json_out.empty())
    write_text(o.json_out, nlohmann::json{{"csv", o.out + "/sweep.csv"}, {"rows", rows}, {"skipped", skipped},
                                          {"failed", failed}}
                               .dump(2) + "\n");
  if (!failed.empty()) {
    std::fprintf(stderr, "error: %zu point(s) failed and are not in the CSV:\n", failed.size());
    for (auto& s : failed) std::fprintf(stderr, "  %s\n", s.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

void add_sweep(CLI::App& app, int& status) {
  auto o = std::make_shared<sweep_opts>();
  auto* cmd = app.add_subcommand("sweep", "a grid of runs (nodes x topology x link x batch) to CSV and plots");
  cmd->add_option("-m,--model", o->model, "model (default lookup as run)");
  cmd->add_option("-z,--tokenizer", o->tokenizer, "tokenizer");
  cmd->add_option("--ctx", o->ctx, "context length N instead of the file's (as run --ctx)")->check(CLI::Range(1, 1 << 24));
  cmd->add_option("-i,--prompt", o->prompt, "prompt");
  cmd->add_option("-n,--steps", o->steps, "positions per run")->capture_default_str();
  cmd->add_option("-t,--temperature", o->temperature, "temperature")->capture_default_str();
  cmd->add_option("-p,--topp", o->topp, "top-p")->capture_default_str();
  cmd->add_option("-s,--seed", o->seed, "seed")->capture_default_str();
  cmd->add_option("--nodes", o->nodes, "node counts, e.g. 1,2,4,8,16,32,64")->delimiter(',')->capture_default_str();
  cmd->add_option("--topology", o->topologies,
                  "pipeline,tensor (each on all N nodes), expert (mixtures of experts: expert:N-1, one stage "
                  "shard and N-1 expert nodes), or fixed layouts: hybrid:PxT, expert:E")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--profile", o->profile, "node profile")->capture_default_str();
  cmd->add_option("--reduce", o->reduces,
                  "all-reduce algorithms of tensor groups, a point each: direct,scatter (as run's --reduce; "
                  "the CSV's last column)")
      ->delimiter(',')
      ->check(CLI::IsMember({"direct", "scatter"}))
      ->capture_default_str();
  cmd->add_option("--link", o->links, "links, e.g. 1gbit:100us,100mbit:100us (none = unshaped)")->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--batch", o->batches, "batch sizes, e.g. 1,8")->delimiter(',')->capture_default_str();
  cmd->add_option("--out", o->out, "output folder")->capture_default_str();
  cmd->add_option("--json", o->json_out, "{csv, rows (the CSV's columns), skipped, failed} to FILE (- = stdout)");
  cmd->add_flag("--no-plots", o->no_plots, "CSV only");
  auto* cl = cmd->add_option("--cluster", o->cluster,
                             "node daemons (run's cluster file): a point of N nodes uses the first N");
  cmd->add_option("--cluster-link", o->cluster_link,
                  "with --cluster: the daemons' links as BANDWIDTH:LATENCY (e.g. shaped by tc in scripts/lab.sh), "
                  "written in the link column")
      ->needs(cl);
  cmd->add_option("--tls-cert", o->tls_cert, "with --cluster: mutual TLS, this side's certificate (PEM)")->needs(cl);
  cmd->add_option("--tls-key", o->tls_key, "with --cluster: this side's private key (PEM)")->needs(cl);
  cmd->add_option("--tls-ca", o->tls_ca, "with --cluster: the CA that signed the nodes' certificates (PEM)")->needs(cl);
  cmd->callback([o, &status, cmd] {
    if (!o->cluster.empty() && cmd->count("--link") > 0)
      throw cli_error("--link shapes in-process nodes; with --cluster the daemons' links are what they are: "
                      "name them with --cluster-link",
                      2);
    status = do_sweep(*o);
  });
}

}  // namespace cellshard::tools
