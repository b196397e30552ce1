// libFuzzer target for aotid's HTTP/1.1 parsing: the bytes a client sends
// on a connection, read as the server reads them (heads, bodies by
// Content-Length or chunked, pipelined requests) and routed. Built with
// clang's -fsanitize=fuzzer,address,undefined (tests/fuzz/CMakeLists.txt)
// and run by tests/fuzz/run.sh.
//
// Beyond no crash: what the parser says it consumed is within the input,
// a finished head consumes something, and no body exceeds the limit. Every
// error the parser states (they quote the client's bytes) is built into
// the JSON error body the API sends, which must not throw and must parse
// back as JSON whatever bytes it quotes. The bodies of the generate and
// repository index routes are read by their own readers (the generate
// request's, the bounded tape); what they refuse must say why.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "fuzz_generate_spec.h"
#include "http/json_tape.h"
#include "http/server.h"
#include "serving/generate.h"
#include "serving/http_api.h"

namespace {

using namespace aotid::http;

void CheckErrorBody(const std::string& error) {
  std::string body = aotid::serving::ErrorBody(error);
  if (!nlohmann::json::accept(body)) __builtin_trap();
}

const Router& TheRouter() {
  static const Router* router = [] {
    auto* r = new Router([](std::string_view m) { return std::string(m); });
    auto echo = [](const Request& req, Response& res) {
      std::string out = req.method + " " + req.path;
      for (const auto& p : req.params) out += " [" + p + "]";
      res.Set(out + " " + std::to_string(req.body.size()), "text/plain");
    };
    r->Add("GET", "/v2/models/*", echo);
    r->Add("POST", "/v2/models/*/versions/*/infer", echo);
    r->Add("POST", "/v2/models/*/generate", [](const Request& req, Response& res) {
      auto parsed = aotid::serving::ParseGenerateRequest(req.body, aotid::fuzz::GenerateSpecForFuzzing());
      if (!parsed.ok() && parsed.status().message().empty()) __builtin_trap();
      if (!parsed.ok()) CheckErrorBody(parsed.status().message());
      res.Set(parsed.ok() ? "{}" : aotid::serving::ErrorBody(parsed.status().message()), "application/json");
    });
    r->Add("POST", "/v2/repository/index", [](const Request& req, Response& res) {
      json_tape::Tape body;
      bool ok = body.Parse(req.body, /*max_depth=*/32);
      if (!ok) CheckErrorBody("repository index body " + body.ErrorPlace(req.body));
      res.Set(ok ? "[]" : "{}", "application/json");
    });
    r->Add("POST", "/v2/repository/models/*/load", echo);
    return r;
  }();
  return *router;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  Limits limits;
  limits.max_header_bytes = 1024;
  limits.max_headers = 16;
  limits.max_body_bytes = 2048;
  for (int n = 0; n < 8 && !in.empty(); ++n) {  // pipelined requests
    Request req;
    HeadResult head = ParseHead(in, limits, &req);
    if (head.state != HeadResult::kDone) {
      if (head.state == HeadResult::kError && (head.status < 400 || head.error.empty())) __builtin_trap();
      if (head.state == HeadResult::kError) CheckErrorBody(head.error);
      return 0;
    }
    if (head.consumed == 0 || head.consumed > in.size()) __builtin_trap();
    in.remove_prefix(head.consumed);
    BodyFraming framing = FramingOf(req);
    if (framing.kind == BodyFraming::kError) {
      CheckErrorBody(framing.error);
      return 0;
    }
    if (framing.kind == BodyFraming::kLength) {
      if (framing.length > static_cast<uint64_t>(limits.max_body_bytes) || framing.length > in.size()) return 0;
      req.body.assign(in.substr(0, framing.length));
      in.remove_prefix(framing.length);
    } else if (framing.kind == BodyFraming::kChunked) {
      ChunkedResult chunked = DecodeChunked(in, limits.max_body_bytes, &req.body);
      if (chunked.consumed > in.size()) __builtin_trap();
      if (req.body.size() > static_cast<size_t>(limits.max_body_bytes)) __builtin_trap();
      if (chunked.state == ChunkedResult::kError) CheckErrorBody(chunked.error);
      if (chunked.state != ChunkedResult::kDone) return 0;
      in.remove_prefix(chunked.consumed);
    }
    Response res;
    TheRouter().Dispatch(req, res);
    if (res.status < 200 || res.status > 599) __builtin_trap();
  }
  return 0;
}
