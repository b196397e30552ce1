// JSON from outside the process, read with bounds.
//
// Every JSON document aotid reads from a registry, a package, a request, a
// config or a column of its store goes through ParseJson. nlohmann's parser
// is iterative, but copying, comparing and dumping its DOM recurse once per
// level, and a DOM node costs far more than the byte that made it: 300,000
// '[' copied by `m["config"]` overflow the stack, and 16 MiB of them cost
// about 1.2 GB. So the text's nesting is measured first, by a scan that
// allocates nothing, and a document deeper than its limit is refused, with
// the place, before any node exists.
#pragma once

#include <cstddef>
#include <exception>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "base/status.h"

namespace aotid {

struct JsonLimits {
  // Arrays and objects inside one another. Nothing aotid reads legitimately
  // goes past 16 (a tokenizer's, an OCI manifest's, a package's metadata).
  int max_depth = 64;
  // The whole document's size in bytes.
  size_t max_bytes = size_t{64} << 20;
  // Values in the document (counted as its arrays, objects and separators,
  // which a scan finds without allocating); 0 for no limit. A DOM node
  // costs 16 to 100 bytes against the 3 bytes of "{}," that make one, so a
  // request body within max_bytes can still ask for gigabytes: 64 MiB of
  // [{},{},...] made 2.4 GB. Request bodies set it.
  size_t max_values = 0;
  // Refuse an object that has a key twice. JSON leaves such an object's
  // meaning open and the parser would keep the last value: {"model": "a",
  // "model": "b"} is a request for "b" that may have meant "a". Request
  // bodies set it.
  bool unique_keys = false;
};

// The most values a request body of the generate and /v1 routes may hold:
// a million (a prompt of token ids, a batch of inputs to embed, a chat of
// many messages all fit well within it), about 100 MB of DOM at worst.
inline constexpr size_t kMaxRequestJsonValues = size_t{1} << 20;

// What a request body of those routes is read with: nested 32 deep at
// most (as /infer's tape), within its own size, kMaxRequestJsonValues
// values, each key once in its object.
inline JsonLimits RequestJsonLimits(size_t body_bytes) {
  return {.max_depth = 32, .max_bytes = body_bytes, .max_values = kMaxRequestJsonValues, .unique_keys = true};
}

// "at byte N (near '...')": a place in `text` for an error message, with up
// to 16 bytes of the text before it and 16 after (bytes outside printable
// ASCII shown as '?').
std::string JsonPlace(std::string_view text, size_t at);

// OK when no array or object in `text` lies deeper than `max_depth` (the
// top level is depth 1); otherwise InvalidArgument naming the depth and the
// byte where it was passed. Brackets inside strings do not count. It does
// not validate anything else: ParseJson does that.
Status CheckJsonDepth(std::string_view text, int max_depth);
// The same scan, refusing also a document with more than `max_values`
// values (0: no limit), naming the byte where the count was passed.
Status CheckJsonShape(std::string_view text, int max_depth, size_t max_values);

// Parses `text` into a DOM within `limits`. InvalidArgument, beginning with
// `what` ("the manifest"), for a document over the size or depth limit or
// one that is not JSON (RFC 8259, UTF-8), naming the byte and the reason,
// or (with unique_keys) one with a key twice in an object, naming the key.
// Never throws.
StatusOr<nlohmann::json> ParseJson(std::string_view text, std::string_view what,
                                   const JsonLimits& limits = {});

// An exception of the JSON library's, for a message: its reason without
// the library's "[json.exception...] " prefix, cut at 200 bytes (it may
// quote a 100 KB number whole).
std::string JsonErrorReason(const std::exception& e);

// Runs `read`, which reads a parsed document, and turns an exception of the
// DOM's (a value of another type than `read` took for granted, which a
// hostile document can always arrange: `.value("k", 0)` on a string
// throws) into InvalidArgument beginning with `what`. Every reader of JSON
// from outside runs inside one, so that a type check it lacks costs a
// refusal, never the process.
template <typename T, typename Read>
StatusOr<T> ReadJsonSafely(std::string_view what, Read&& read) {
  try {
    return read();
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(std::string(what) + " has a value of an unexpected type (" + JsonErrorReason(e) +
                           ")");
  }
}

// For JSON aotid wrote itself and reads back (its store's columns, its
// cache's records): the DOM, or a discarded value (is_discarded(), and not
// an object, array or string) when `text` is not JSON within `limits`.
nlohmann::json ParseJsonOrDiscarded(std::string_view text, const JsonLimits& limits = {});

}  // namespace aotid
