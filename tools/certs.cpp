// `cellshard certs DIR`: a certificate authority plus a node and a client
// certificate for mutual TLS between the front end and node daemons, in one
// command (issue #20: TLS is the normal way; a plain daemon listens on
// loopback only). Made with the openssl command line (Debian's openssl
// package): EC P-256 keys, the CA self-signed, the leaves signed by it with
// serverAuth+clientAuth and the subjectAltNames given by --ip/--dns.
//
// Files: ca.pem, ca.key (keep it off the nodes), node.pem, node.key,
// client.pem, client.key. Keys are written 0600.
#include "base/spawn.hpp"
#include "tools/commands.hpp"
#include "tools/common.hpp"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

namespace cellshard::tools {

namespace {

struct certs_opts {
  std::string dir, json_out;
  std::vector<std::string> ips, dns;
  int days = 365;
  bool force = false;
};

/// Runs a program (no shell) with its stdout/stderr to /dev/null; returns its
/// exit status, or -1 when it could not run.
int run_quiet(std::vector<std::string> args) {
  args[0] = find_program(args[0]);  // the PATH search execvp would do
  if (args[0].empty()) return -1;
  const pid_t pid = spawn_child(args);  // stdin, stdout, stderr on /dev/null (base/spawn.hpp)
  if (pid < 0) return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

bool exists(const std::string& p) {
  struct stat sb;
  return ::stat(p.c_str(), &sb) == 0;
}

int do_certs(const certs_opts& o) {
  if (::mkdir(o.dir.c_str(), 0700) != 0 && !exists(o.dir))
    throw cli_error("certs: cannot create " + o.dir);
  for (const char* f : {"/ca.pem", "/node.pem", "/client.pem"})
    if (exists(o.dir + f) && !o.force)
      throw cli_error("certs: " + o.dir + f + " exists already (--force overwrites)", 2);
  if (run_quiet({"openssl", "version"}) != 0)
    throw cli_error("certs: the openssl command is not installed (Debian: apt-get install openssl)");
  std::string san;
  for (const auto& ip : o.ips) san += (san.empty() ? "" : ",") + std::string("IP:") + ip;
  for (const auto& d : o.dns) san += (san.empty() ? "" : ",") + std::string("DNS:") + d;
  if (san.empty()) san = "IP:127.0.0.1,IP:::1,DNS:localhost";
  const std::string ext = o.dir + "/leaf.ext";
  {
    std::ofstream e(ext);
    e << "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
         "extendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=" << san << "\n";
    if (!e) throw cli_error("certs: cannot write " + ext);
  }
  const std::string days = std::to_string(o.days);
  auto step = [&](const std::string& what, const std::vector<std::string>& args) {
    if (run_quiet(args) != 0) throw cli_error("certs: openssl failed making " + what + " in " + o.dir);
  };
  step("the CA", {"openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                  "-nodes", "-keyout", o.dir + "/ca.key", "-out", o.dir + "/ca.pem", "-days", days, "-subj",
                  "/CN=cellshard cluster CA"});
  for (const std::string name : {"node", "client"}) {
    step(name + ".key", {"openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                         "-keyout", o.dir + "/" + name + ".key", "-out", o.dir + "/" + name + ".csr", "-subj",
                         "/CN=cellshard " + name});
    step(name + ".pem", {"openssl", "x509", "-req", "-in", o.dir + "/" + name + ".csr", "-CA", o.dir + "/ca.pem",
                         "-CAkey", o.dir + "/ca.key", "-CAcreateserial", "-out", o.dir + "/" + name + ".pem",
                         "-days", days, "-extfile", ext});
    std::remove((o.dir + "/" + name + ".csr").c_str());
  }
  std::remove(ext.c_str());
  std::remove((o.dir + "/ca.srl").c_str());
  for (const char* k : {"/ca.key", "/node.key", "/client.key"})
    if (::chmod((o.dir + k).c_str(), 0600) != 0)
      throw cli_error("certs: cannot make " + o.dir + k + " private (chmod 0600): " + std::strerror(errno));
  std::printf("made %s/{ca,node,client}.{pem,key} (subjectAltName %s, %d days)\n", o.dir.c_str(), san.c_str(),
              o.days);
  std::printf("node:      cellshard node --listen HOST:PORT --models DIR --tls-cert %s/node.pem --tls-key "
              "%s/node.key --tls-ca %s/ca.pem\n",
              o.dir.c_str(), o.dir.c_str(), o.dir.c_str());
  std::printf("front end: cellshard run --cluster FILE --tls-cert %s/client.pem --tls-key %s/client.key "
              "--tls-ca %s/ca.pem ...\n",
              o.dir.c_str(), o.dir.c_str(), o.dir.c_str());
  std::printf("keep %s/ca.key off the nodes: it signs new members\n", o.dir.c_str());
  if (!o.json_out.empty()) {
    nlohmann::json files;
    for (const std::string f : {"ca", "node", "client"})
      files[f] = {{"certificate", o.dir + "/" + f + ".pem"}, {"key", o.dir + "/" + f + ".key"}};
    write_text(o.json_out, nlohmann::json{{"dir", o.dir}, {"subject_alt_name", san}, {"days", o.days}, {"files", files}}
                               .dump(2) + "\n");
  }
  return 0;
}

}  // namespace

void add_certs(CLI::App& app, int& status) {
  auto o = std::make_shared<certs_opts>();
  auto* cmd = app.add_subcommand("certs", "make a CA and node/client certificates for mutual TLS in DIR");
  cmd->add_option("dir", o->dir, "folder for ca.pem, node.pem/.key, client.pem/.key")->required();
  cmd->add_option("--ip", o->ips, "an IP address the nodes are reached at (repeatable; default 127.0.0.1, ::1)");
  cmd->add_option("--dns", o->dns, "a host name the nodes are reached at (repeatable; default localhost)");
  cmd->add_option("--days", o->days, "validity in days")->check(CLI::Range(1, 36500))->capture_default_str();
  cmd->add_flag("--force", o->force, "overwrite certificates already in DIR");
  cmd->add_option("--json", o->json_out, "{dir, subject_alt_name, days, files} to FILE (- = stdout)");
  cmd->callback([o, &status] { status = do_certs(*o); });
}

}  // namespace cellshard::tools
