// libFuzzer target for the text a generate request brings: the tokenizer
// (SmolLM2's, from the fixture), UTF-8 streaming, stop strings and the
// request parser. Built and run as the other targets (tests/fuzz/).
//
// Checks besides the sanitizers: whatever encodes decodes back to the same
// text (less the bytes SmolLM2's vocabulary has no token for);
// streaming the bytes in two pieces gives what decoding them whole gives;
// no stop string, nor its start at the end, ever leaves the stop matcher.
// The same bytes go to the generate request parser and to OpenAI's /v1
// chat and completions parsers (with the prompt prepared from what they
// read): an error, never a crash.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "fuzz_generate_spec.h"
#include "serving/generate.h"
#include "serving/openai.h"
#include "text/generation.h"
#include "text/tokenizer.h"

namespace {

const aotid::text::GenerateSpec& Spec() { return aotid::fuzz::GenerateSpecForFuzzing(); }

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  const aotid::text::Tokenizer& tok = *Spec().tokenizer;
  auto ids = tok.Encode(in);
  Check(ids.ok() == aotid::text::ValidUtf8(in));
  // SmolLM2 has no token for the lead bytes F1 and F2 either (planes 4 to
  // 12): their characters lose their lead, as in the reference, and do not
  // come back whole.
  if (ids.ok() && in.find('\xF1') == std::string_view::npos && in.find('\xF2') == std::string_view::npos) {
    std::string want;
    for (char c : in) {
      if (c != 4 && c != 6 && c != 19 && c != 20 && c != 22 && c != 29) want.push_back(c);
    }
    Check(tok.Decode(*ids) == want);
    auto plain = tok.Encode(in, false);
    Check(plain.ok() && tok.Decode(*plain) == want);
  }
  // Streaming in two pieces equals decoding whole.
  size_t cut = size == 0 ? 0 : data[0] % (size + 1);
  aotid::text::Utf8Stream whole, pieces;
  std::string a = whole.Push(in) + whole.Flush();
  std::string b = pieces.Push(in.substr(0, cut));
  b += pieces.Push(in.substr(cut));
  b += pieces.Flush();
  Check(a == b && aotid::text::ValidUtf8(a));
  // A stop string made of the input's first bytes never shows.
  if (size >= 3) {
    std::string stop(in.substr(0, 2));
    aotid::text::StopMatcher m({stop});
    bool stopped = false;
    std::string out;
    for (size_t i = 2; i < size && !stopped; i += 3) out += m.Push(in.substr(i, 3), &stopped);
    if (!stopped) out += m.Flush();
    Check(out.find(stop) == std::string::npos);
  }
  // The request parser on the same bytes.
  (void)aotid::serving::ParseGenerateRequest(in, Spec());
  for (auto endpoint :
       {aotid::serving::OpenAiEndpoint::kChat, aotid::serving::OpenAiEndpoint::kCompletions}) {
    aotid::serving::OpenAiRequest req;
    aotid::serving::OpenAiError err;
    if (aotid::serving::ParseOpenAiRequest(in, endpoint, &req, &err)) {
      (void)aotid::serving::PreparePrompt(Spec(), &req, &err);
    } else {
      Check(err.status == 400 && !err.message.empty());
    }
  }
  return 0;
}
