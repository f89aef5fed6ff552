#include "model/journal.hpp"

#include "model/checkpoint.hpp"

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace cellshard::model {

namespace {

uint64_t chain(const std::string& text, uint64_t prev) { return XXH64(text.data(), text.size(), prev); }

std::string entry_text(const journal_entry& e) {
  return std::to_string(e.pos) + " " + std::to_string(e.token) + " " + std::to_string(e.rng);
}

nlohmann::json header_json(const journal_header& h) {
  nlohmann::json j = {{"journal", journal_version},
          {"steps", h.steps},
          {"temperature", h.temperature},
          {"topp", h.topp},
          {"seed", h.seed},
          {"model", h.model},
          {"model_path", h.model_path},
          {"model_digest", format_digest(h.model_digest)},
          {"tokenizer", h.tokenizer},
          {"tokenizer_path", h.tokenizer_path},
          {"tokenizer_digest", format_digest(h.tokenizer_digest)},
          {"prompt_tokens", h.prompt_tokens}};
  if (h.ctx > 0) j["ctx"] = h.ctx;
  return j;
}

bool parse_hex(const std::string& s, uint64_t& v) {
  if (s.size() != 18 || s[0] != '0' || s[1] != 'x') return false;
  v = 0;
  for (size_t i = 2; i < s.size(); ++i) {
    const char c = s[i];
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else return false;
    v = v << 4 | static_cast<uint64_t>(d);
  }
  return true;
}

}  // namespace

std::string journal_header_line(const journal_header& h, uint64_t* digest) {
  nlohmann::json j = header_json(h);
  const uint64_t d = chain(j.dump(), 0);
  j["digest"] = format_digest(d);
  if (digest) *digest = d;
  return j.dump();
}

std::string journal_entry_line(const journal_entry& e, uint64_t prev, uint64_t* digest) {
  const uint64_t d = chain(entry_text(e), prev);
  if (digest) *digest = d;
  char buf[160];
  std::snprintf(buf, sizeof buf, "{\"pos\": %d, \"token\": %d, \"rng\": %llu, \"digest\": \"%s\"}", e.pos, e.token,
                static_cast<unsigned long long>(e.rng), format_digest(d).c_str());
  return buf;
}

result<journal> parse_journal(std::string_view text, const std::string& name) {
  journal out;
  size_t start = 0;
  int line_no = 0;
  bool header = false;
  while (start < text.size()) {
    ++line_no;
    const size_t nl = text.find('\n', start);
    const std::string where = name + ": line " + std::to_string(line_no) + ": ";
    if (nl == std::string_view::npos)
      return make_error(where + "cut short (no end of line): the journal was truncated inside this line; expected "
                                "whole lines only (delete the partial line to resume from the one before)");
    const std::string line(text.substr(start, nl - start));
    start = nl + 1;
    if (line.empty()) return make_error(where + "empty; expected a JSON object on every line");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      return make_error(where + "not JSON (" + e.what() + "): the line was edited or cut");
    }
    if (!j.is_object()) return make_error(where + "expected a JSON object");
    auto field = [&](const char* key) -> result<const nlohmann::json*> {
      auto it = j.find(key);
      if (it == j.end()) return make_error(where + "missing field \"" + key + "\"");
      return &*it;
    };
    auto digest_of = [&](uint64_t& d) -> result<void> {
      auto f = field("digest");
      if (!f) return f.err();
      if (!(*f)->is_string() || !parse_hex((*f)->get<std::string>(), d))
        return make_error(where + "field \"digest\" is " + (*f)->dump() + ", expected \"0x\" and 16 hex digits");
      return {};
    };
    try {
      if (!header) {
        auto v = field("journal");
        if (!v) return make_error(name + ": line 1: not a cellshard journal (expected a header with \"journal\": " +
                                  std::to_string(journal_version) + ")");
        if (!(*v)->is_number_integer() || (*v)->get<int>() != journal_version)
          return make_error(where + "journal version " + (*v)->dump() + ", expected " +
                            std::to_string(journal_version) +
                            (((*v)->is_number_integer() && (*v)->get<int>() == 1)
                                 ? " (version 1 journals carry no digests and cannot be verified; rerun the request)"
                                 : ""));
        uint64_t d = 0;
        auto dd = digest_of(d);
        if (!dd) return dd.err();
        auto& h = out.header;
        auto num = [&](const char* key, bool integer) -> result<const nlohmann::json*> {
          auto f = field(key);
          if (!f) return f;
          if (integer ? !(*f)->is_number_integer() : !(*f)->is_number())
            return make_error(where + "field \"" + key + "\" is " + (*f)->dump() + ", expected " +
                              (integer ? "an integer" : "a number"));
          return f;
        };
        auto str = [&](const char* key, std::string& s, bool required) -> result<void> {
          auto it = j.find(key);
          if (it == j.end()) {
            if (required) return make_error(where + "missing field \"" + key + "\"");
            return {};
          }
          if (!it->is_string()) return make_error(where + "field \"" + key + "\" is " + it->dump() + ", expected a string");
          s = it->get<std::string>();
          return {};
        };
        auto steps = num("steps", true);
        if (!steps) return steps.err();
        h.steps = (*steps)->get<int>();
        if (h.steps < 1) return make_error(where + "field \"steps\" is " + std::to_string(h.steps) + ", expected at least 1");
        auto t = num("temperature", false);
        if (!t) return t.err();
        h.temperature = (*t)->get<float>();
        auto p = num("topp", false);
        if (!p) return p.err();
        h.topp = (*p)->get<float>();
        auto s = num("seed", true);
        if (!s) return s.err();
        if (!(*s)->is_number_unsigned()) return make_error(where + "field \"seed\" is negative, expected 0 or more");
        h.seed = (*s)->get<uint64_t>();
        for (auto [key, dst, req] : {std::tuple<const char*, std::string*, bool>{"model", &h.model, true},
                                     {"model_path", &h.model_path, false},
                                     {"tokenizer", &h.tokenizer, true},
                                     {"tokenizer_path", &h.tokenizer_path, false}}) {
          auto r = str(key, *dst, req);
          if (!r) return r.err();
        }
        for (auto [key, dst] : {std::pair<const char*, uint64_t*>{"model_digest", &h.model_digest},
                                {"tokenizer_digest", &h.tokenizer_digest}}) {
          std::string hex;
          auto r = str(key, hex, true);
          if (!r) return r.err();
          if (!parse_hex(hex, *dst))
            return make_error(where + "field \"" + key + "\" is \"" + hex + "\", expected \"0x\" and 16 hex digits");
        }
        if (auto c = j.find("ctx"); c != j.end()) {
          if (!c->is_number_integer() || c->get<int64_t>() < 1 || c->get<int64_t>() > INT32_MAX)
            return make_error(where + "field \"ctx\" is " + c->dump() +
                              ", expected the context length the run used (an integer >= 1)");
          h.ctx = c->get<int>();
        }
        auto pt = field("prompt_tokens");
        if (!pt) return pt.err();
        if (!(*pt)->is_array() || (*pt)->empty())
          return make_error(where + "field \"prompt_tokens\" is " + (*pt)->dump() +
                            ", expected a non-empty array of token ids");
        for (const auto& v : **pt) {
          if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
            return make_error(where + "field \"prompt_tokens\" holds " + v.dump() + ", expected token ids (>= 0)");
          h.prompt_tokens.push_back(v.get<int>());
        }
        // The digest covers the fields as the writer spells them (so a
        // reader's parse and the writer's lines agree on every accepted file).
        const uint64_t want = chain(header_json(h).dump(), 0);
        if (d != want)
          return make_error(where + "digest " + format_digest(d) + " does not match the header's fields (" +
                            format_digest(want) + "): the header was edited");
        out.digest = d;
        header = true;
        continue;
      }
      journal_entry e;
      for (auto [key, dst] : {std::pair<const char*, int*>{"pos", &e.pos}, {"token", &e.token}}) {
        auto f = field(key);
        if (!f) return f.err();
        if (!(*f)->is_number_integer() || (*f)->get<int64_t>() < 0 || (*f)->get<int64_t>() > INT32_MAX)
          return make_error(where + "field \"" + key + "\" is " + (*f)->dump() + ", expected an integer >= 0");
        *dst = (*f)->get<int>();
      }
      auto r = field("rng");
      if (!r) return r.err();
      if (!(*r)->is_number_unsigned())
        return make_error(where + "field \"rng\" is " + (*r)->dump() + ", expected an unsigned 64-bit integer");
      e.rng = (*r)->get<uint64_t>();
      const int want_pos = static_cast<int>(out.entries.size()) + 1;
      if (e.pos != want_pos) {
        if (e.pos > want_pos)
          return make_error(where + "position " + std::to_string(e.pos) + ", expected " + std::to_string(want_pos) +
                            ": a gap (the line" + (e.pos - want_pos > 1 ? "s" : "") + " of position" +
                            (e.pos - want_pos > 1 ? "s " + std::to_string(want_pos) + "-" + std::to_string(e.pos - 1)
                                                  : " " + std::to_string(want_pos)) +
                            " missing)");
        return make_error(where + "position " + std::to_string(e.pos) + ", expected " + std::to_string(want_pos) +
                          ": a line repeated or out of order");
      }
      // steps forward passes give ids at positions 0..steps (BOS at 0).
      if (e.pos > out.header.steps)
        return make_error(where + "position " + std::to_string(e.pos) + " is beyond the journal's " +
                          std::to_string(out.header.steps) + " steps");
      const auto& pr = out.header.prompt_tokens;
      if (e.pos < static_cast<int>(pr.size()) && pr[static_cast<size_t>(e.pos)] != e.token)
        return make_error(where + "token " + std::to_string(e.token) + " at prompt position " +
                          std::to_string(e.pos) + ", but the header's prompt has " +
                          std::to_string(pr[static_cast<size_t>(e.pos)]));
      uint64_t d = 0;
      auto dd = digest_of(d);
      if (!dd) return dd.err();
      const uint64_t want = chain(entry_text(e), out.digest);
      if (d != want)
        return make_error(where + "digest " + format_digest(d) + " does not match the journal up to this line (" +
                          format_digest(want) + "): this line was edited");
      out.digest = d;
      out.entries.push_back(e);
    } catch (const nlohmann::json::exception& e) {
      return make_error(where + "ill-typed field: " + e.what());
    }
  }
  if (!header) return make_error(name + ": empty; expected a cellshard journal (a header line first)");
  return out;
}

result<journal> read_journal(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(path + ": cannot read journal: " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return make_error(path + ": read failed");
  return parse_journal(ss.str(), path);
}

result<std::unique_ptr<journal_writer>> journal_writer::create(const std::string& path, const journal_header& h) {
  std::unique_ptr<journal_writer> w(new journal_writer());
  w->path_ = path;
  w->f_ = std::fopen(path.c_str(), "w");
  if (!w->f_) return make_error("journal " + path + ": cannot create: " + std::strerror(errno));
  auto r = w->write_line(journal_header_line(h, &w->digest_));
  if (!r) return r.err();
  return w;
}

result<std::unique_ptr<journal_writer>> journal_writer::resume(const std::string& path, const journal& j) {
  std::unique_ptr<journal_writer> w(new journal_writer());
  w->path_ = path;
  w->f_ = std::fopen(path.c_str(), "a");
  if (!w->f_) return make_error("journal " + path + ": cannot append: " + std::strerror(errno));
  w->digest_ = j.digest;
  w->next_pos_ = static_cast<int>(j.entries.size()) + 1;
  return w;
}

journal_writer::~journal_writer() {
  if (f_) std::fclose(f_);
}

result<void> journal_writer::write_line(const std::string& line) {
  if (!error_.empty()) return make_error(error_);
  if (!f_) return make_error("journal " + path_ + ": closed");
  errno = 0;
  if (std::fwrite(line.data(), 1, line.size(), f_) != line.size() || std::fputc('\n', f_) == EOF ||
      std::fflush(f_) != 0) {
    error_ = "journal " + path_ + ": write failed: " + std::strerror(errno ? errno : EIO);
    return make_error(error_);
  }
  return {};
}

result<void> journal_writer::append(const journal_entry& e) {
  if (e.pos != next_pos_)
    return make_error("journal " + path_ + ": position " + std::to_string(e.pos) + " appended, expected " +
                      std::to_string(next_pos_));
  uint64_t d = 0;
  auto r = write_line(journal_entry_line(e, digest_, &d));
  if (!r) return r;
  digest_ = d;
  ++next_pos_;
  return {};
}

result<void> journal_writer::close() {
  if (!f_) return error_.empty() ? result<void>{} : result<void>{make_error(error_)};
  const int rc = std::fclose(f_);
  f_ = nullptr;
  if (rc != 0 && error_.empty()) error_ = "journal " + path_ + ": close failed: " + std::strerror(errno);
  if (!error_.empty()) return make_error(error_);
  return {};
}

}  // namespace cellshard::model
