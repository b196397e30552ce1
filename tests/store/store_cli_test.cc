// The store through its real entrance: the aotid binary, run as separate
// processes against one store directory, with no daemon. Covers the CLI
// commands, several writers at once, kill -9 at chosen points of an add, and
// bad input that must leave the store byte-for-byte as it was.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "base/fs.h"
#include "base/poll.h"
#include "e2e/daemon_process.h"
#include "package/archive.h"
#include "storage/model_store.h"
#include "test_util.h"
#include "zip_util.h"

namespace aotid::testing {
namespace {

using json = nlohmann::json;
namespace stdfs = std::filesystem;

std::vector<std::string> FilesIn(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto& e : stdfs::directory_iterator(dir, ec)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// No version row without its blob, every blob matching its digest, and
// SQLite's own checks clean.
void ExpectStoreConsistent(const std::string& dir) {
  auto store = storage::ModelStore::Open(dir, false);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_OK((*store)->CheckIntegrity());
  auto versions = (*store)->ListVersions();
  ASSERT_TRUE(versions.ok());
  for (const auto& v : *versions) {
    auto sha = fs::Sha256File((*store)->BlobPath(v.artifact));
    ASSERT_TRUE(sha.ok()) << v.model << ":" << v.version << " has no blob: " << sha.status().ToString();
    EXPECT_EQ(*sha, v.artifact);
  }
}

// One JSON entry of a package.
json Entry(const std::string& path, const std::string& entry) {
  auto archive = package::Archive::Open(path);
  EXPECT_TRUE(archive.ok()) << archive.status().ToString();
  auto text = archive.ok() ? archive->Read(entry) : archive.status();
  EXPECT_TRUE(text.ok()) << text.status().ToString();
  return json::parse(text.ok() ? *text : "", nullptr, false);
}

class StoreCli : public ::testing::Test {
 protected:
  std::vector<std::string> Args(std::vector<std::string> args) const {
    args.insert(args.begin(), {"--store", store_});
    return args;
  }
  int Run(std::vector<std::string> args, std::string* out = nullptr) {
    return RunAotid(Args(std::move(args)), out);
  }

  TempDir dir_;
  std::string store_ = dir_ / "store";
};

TEST_F(StoreCli, AddShowSetRmGcRoundTrip) {
  std::string out;
  ASSERT_EQ(Run({"add", TestData("mlp.pt2"), "--name", "mlp", "--num-runners", "2", "--max-batch-size", "8",
                 "--no-fallback-cpu"},
                &out),
            0)
      << out;
  EXPECT_NE(out.find("added mlp:1"), std::string::npos) << out;
  EXPECT_EQ(out.find("note: the same file"), std::string::npos) << out;
  ASSERT_EQ(Run({"add", TestData("embed.pt2"), "--name", "mlp"}, &out), 0) << out;
  EXPECT_NE(out.find("added mlp:2"), std::string::npos) << out;
  EXPECT_EQ(out.find("note: the same file"), std::string::npos) << out;

  ASSERT_EQ(Run({"show", "mlp:1", "--json"}, &out), 0) << out;
  json shown = json::parse(out);
  ASSERT_EQ(shown["versions"].size(), 1u);
  const json& v1 = shown["versions"][0];
  EXPECT_EQ(v1["version"], 1);
  EXPECT_EQ(v1["artifact"], *fs::Sha256File(TestData("mlp.pt2")));
  EXPECT_EQ(v1["settings"], json::parse(R"({"device":"auto","fallback_cpu":false,"num_runners":2,
                                             "max_batch_size":8,"max_batch_delay_us":0,"threads":0,
                                             "timeout_s":0,"memory_limit_mb":0,"max_sequences":0,
                                             "keep_alive":"default","inductor_options":{}})"));
  EXPECT_EQ(v1["served_by_policy"], false);  // the latest (2) is
  EXPECT_TRUE(v1["blob_present"].get<bool>());
  EXPECT_TRUE(v1["builds"].empty());
  EXPECT_EQ(shown["version_policy"], "latest");

  // One bad value anywhere: nothing at all changes.
  auto before = DirSnapshot(store_);
  EXPECT_EQ(Run({"set", "mlp", "num_runners=3", "max_batch_size=0"}, &out), 5);
  EXPECT_NE(out.find("max_batch_size must be between 1 and 4096, got 0"), std::string::npos) << out;
  EXPECT_EQ(Run({"set", "mlp", "colour=blue"}, &out), 5);
  EXPECT_NE(out.find("unknown setting 'colour'"), std::string::npos) << out;
  EXPECT_EQ(Run({"set", "mlp", "version_policy=pinned:9"}, &out), 3);
  EXPECT_NE(out.find("no such version"), std::string::npos) << out;
  EXPECT_EQ(Run({"set", "mlp:1", "version_policy=all"}, &out), 5);
  EXPECT_EQ(Run({"set", "ghost", "num_runners=2"}, &out), 3);
  EXPECT_NE(out.find("no model named 'ghost'"), std::string::npos) << out;
  EXPECT_EQ(DirSnapshot(store_), before);

  ASSERT_EQ(Run({"set", "mlp", "num_runners=3", "version_policy=pinned:1"}, &out), 0) << out;
  EXPECT_NE(out.find("set mlp:1 num_runners 2 -> 3"), std::string::npos) << out;
  EXPECT_NE(out.find("set mlp:2 num_runners 1 -> 3"), std::string::npos) << out;
  EXPECT_NE(out.find("set mlp version_policy latest -> pinned:1"), std::string::npos) << out;
  ASSERT_EQ(Run({"set", "mlp", "num_runners=3"}, &out), 0) << out;
  EXPECT_NE(out.find("nothing changed"), std::string::npos) << out;

  // Threads and inductor options: per version, canonical JSON, removable.
  before = DirSnapshot(store_);
  EXPECT_EQ(Run({"set", "mlp:1", "inductor.cpp..simdlen=8"}, &out), 5);
  EXPECT_NE(out.find("is not a dotted name"), std::string::npos) << out;
  EXPECT_EQ(Run({"set", "mlp:1", "threads=-1"}, &out), 5);
  EXPECT_EQ(DirSnapshot(store_), before);
  ASSERT_EQ(Run({"set", "mlp:1", "threads=1", "inductor.max_autotune=true", "inductor.cpp.simdlen=8"}, &out),
            0)
      << out;
  EXPECT_NE(out.find("set mlp:1 threads auto -> 1"), std::string::npos) << out;
  EXPECT_NE(out.find(R"(set mlp:1 inductor_options {} -> {"cpp.simdlen":8,"max_autotune":true})"),
            std::string::npos)
      << out;
  ASSERT_EQ(Run({"set", "mlp:1", "inductor.max_autotune="}, &out), 0) << out;
  EXPECT_NE(out.find(R"(-> {"cpp.simdlen":8})"), std::string::npos) << out;
  ASSERT_EQ(Run({"show", "mlp:1"}, &out), 0) << out;
  EXPECT_NE(out.find(R"(threads=1 timeout_s=default memory_limit_mb=default max_sequences=auto )"
                     R"(keep_alive=default inductor={"cpp.simdlen":8})"),
            std::string::npos)
      << out;

  EXPECT_EQ(Run({"set", "mlp:1", "enabled=false"}, &out), 5);
  EXPECT_NE(out.find("enabled belongs to the model"), std::string::npos) << out;
  ASSERT_EQ(Run({"set", "mlp", "enabled=false"}, &out), 0) << out;
  EXPECT_NE(out.find("set mlp enabled true -> false"), std::string::npos) << out;
  ASSERT_EQ(Run({"ls", "--json"}, &out), 0) << out;
  EXPECT_EQ(json::parse(out)[0]["enabled"], false);
  EXPECT_EQ(json::parse(out)[0]["served_by_policy"], false);
  ASSERT_EQ(Run({"set", "mlp", "enabled=true"}, &out), 0) << out;

  ASSERT_EQ(Run({"ls", "--json"}, &out), 0) << out;
  json ls = json::parse(out);
  ASSERT_EQ(ls.size(), 2u);
  EXPECT_EQ(ls[0]["served_by_policy"], true);  // pinned:1
  EXPECT_EQ(ls[1]["served_by_policy"], false);
  EXPECT_EQ(ls[0]["build"], "none");

  // The pinned version cannot go while others stay.
  EXPECT_EQ(Run({"rm", "mlp:1"}, &out), 1);
  EXPECT_NE(out.find("pinned to version 1"), std::string::npos) << out;
  ASSERT_EQ(Run({"rm", "mlp:2"}, &out), 0) << out;
  EXPECT_EQ(Run({"rm", "mlp:2"}, &out), 3);
  EXPECT_NE(out.find("has no version 2 (versions: 1)"), std::string::npos) << out;

  // gc removes the embed blob (no longer referenced) and keeps mlp's; a
  // cached build of the removed artifact goes too.
  std::string embed_sha = *fs::Sha256File(TestData("embed.pt2"));
  std::string mlp_sha = *fs::Sha256File(TestData("mlp.pt2"));
  ASSERT_OK(fs::MakeDirs(store_ + "/cache/" + embed_sha + "/model.cpu.fp"));
  ASSERT_OK(fs::WriteFileAtomic(store_ + "/cache/" + embed_sha + "/model.cpu.fp/model.pt2", "x"));
  ASSERT_EQ(Run({"gc", "--dry-run"}, &out), 0) << out;
  EXPECT_NE(out.find("would remove artifact sha256:" + embed_sha), std::string::npos) << out;
  EXPECT_NE(out.find("would remove cached build cache/" + embed_sha + "/model.cpu.fp"), std::string::npos)
      << out;
  EXPECT_TRUE(fs::Exists(store_ + "/blobs/sha256/" + embed_sha));
  EXPECT_TRUE(fs::Exists(store_ + "/cache/" + embed_sha + "/model.cpu.fp"));
  // The total a dry run announces is the one the real gc frees: the blob
  // and the cached build both.
  auto total = [](const std::string& text, const std::string& tail) {
    size_t end = text.find(tail), start = text.rfind("; ", end);
    return end == std::string::npos || start == std::string::npos ? std::string("?")
                                                                  : text.substr(start + 2, end - start - 2);
  };
  std::string would = total(out, " would be freed");
  ASSERT_EQ(Run({"gc"}, &out), 0) << out;
  EXPECT_EQ(total(out, " freed"), would) << out;
  EXPECT_NE(would, "?");
  EXPECT_NE(out.find("removed artifact sha256:" + embed_sha), std::string::npos) << out;
  // One line per cache entry, with why, as `cache prune` prints them; the
  // count is of entries too.
  EXPECT_NE(
      out.find("removed cached build cache/" + embed_sha + "/model.cpu.fp (1 B): no stored version uses it"),
      std::string::npos)
      << out;
  EXPECT_NE(out.find("removed 1 blobs, 1 cache entries, 0 partial copies"), std::string::npos) << out;
  EXPECT_EQ(FilesIn(store_ + "/blobs/sha256"), std::vector<std::string>{mlp_sha});
  EXPECT_FALSE(fs::Exists(store_ + "/cache/" + embed_sha));

  ASSERT_EQ(Run({"rm", "mlp"}, &out), 0) << out;
  ASSERT_EQ(Run({"ls", "--json"}, &out), 0) << out;
  EXPECT_EQ(json::parse(out), json::array());
  ASSERT_EQ(Run({"gc"}, &out), 0) << out;
  EXPECT_TRUE(FilesIn(store_ + "/blobs/sha256").empty());

  // The event log tells the whole story, oldest first.
  ASSERT_EQ(Run({"events", "--json", "-n", "100"}, &out), 0) << out;
  std::vector<std::string> kinds;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) kinds.push_back(json::parse(line)["kind"]);
  EXPECT_EQ(kinds, (std::vector<std::string>{"added", "added", "settings", "settings", "settings", "settings",
                                             "settings", "settings", "settings", "removed", "removed"}));
  ExpectStoreConsistent(store_);
}

// `ls` and `show` say what each version is for, from its package, before
// any build: a language model's context, end tokens and weights, an
// embedding model's vectors, tensors for the rest.
TEST_F(StoreCli, LsAndShowSayWhatAModelIsFor) {
  // An embedding package as aotid_export.embed writes its record, with
  // all-MiniLM-L6-v2's tokenizer (the program itself is not read).
  const std::string embed = dir_ / "embed.pt2";
  json record = {{"format", 1},
                 {"input_names", {"input_ids", "attention_mask"}},
                 {"output_names", {"embedding"}},
                 {"metadata", json::object()},
                 {"embed",
                  {{"kind", "sentence_embedding"},
                   {"input_ids", "input_ids"},
                   {"attention_mask", "attention_mask"},
                   {"output", "embedding"},
                   {"dim", 384},
                   {"pooling", "cls"},
                   {"normalize", false},
                   {"max_seq_len", 128},
                   {"truncatable_dims", true},
                   {"tokenizer", "aotid_embed_tokenizer.json"},
                   {"special_tokens", {{"cls", 101}, {"sep", 102}, {"pad", 0}, {"unk", 100}}}}}};
  WriteZip(embed, {{"enc/models/model.json", "{}"},
                   {"enc/extra/aotid.json", record.dump()},
                   {"enc/extra/aotid_embed_tokenizer.json",
                    *fs::ReadFile(std::string(AOTID_SOURCE_DIR) + "/tests/text/minilm_tokenizer.json")}});
  std::string out;
  for (auto [file, name] :
       std::vector<std::pair<std::string, std::string>>{{TestData("tiny_llm.pt2"), "chat"},
                                                        {TestData("tiny_llm_int8.pt2"), "int8"},
                                                        {embed, "enc"},
                                                        {TestData("mlp.pt2"), "mlp"}}) {
    ASSERT_EQ(Run({"add", file, "--name", name}, &out), 0) << out;
  }

  ASSERT_EQ(Run({"ls", "--json"}, &out), 0) << out;
  std::map<std::string, std::string> tasks;
  for (const auto& v : json::parse(out)) tasks[v["name"]] = v["task"];
  EXPECT_EQ(tasks, (std::map<std::string, std::string>{{"chat", "text generation"},
                                                       {"int8", "text generation"},
                                                       {"enc", "embeddings"},
                                                       {"mlp", "tensors"}}));
  ASSERT_EQ(Run({"ls"}, &out), 0) << out;
  EXPECT_NE(out.find(" TASK "), std::string::npos) << out;
  EXPECT_NE(out.find("chat                     1        text generation"), std::string::npos) << out;
  EXPECT_NE(out.find("enc                      1        embeddings"), std::string::npos) << out;

  // The language models' as their packages' records say.
  auto llm = Entry(TestData("tiny_llm.pt2"), "tiny_llm/extra/aotid.json")["generate"];
  ASSERT_EQ(Run({"show", "chat", "--json"}, &out), 0) << out;
  json chat = json::parse(out)["versions"][0]["purpose"];
  EXPECT_EQ(chat["task"], "text generation");
  EXPECT_EQ(chat["generates"]["context_length"], llm["max_seq_len"]);
  ASSERT_EQ(chat["generates"]["end_tokens"].size(), 1u);
  EXPECT_EQ(chat["generates"]["end_tokens"][0]["id"], llm["eos_token_ids"][0]);
  EXPECT_EQ(chat["generates"]["chat_template"], true);
  EXPECT_EQ(chat["weights"], "float32");
  ASSERT_EQ(Run({"show", "int8"}, &out), 0) << out;
  EXPECT_NE(out.find("  task            text generation\n"), std::string::npos) << out;
  EXPECT_NE(out.find("  context         " + llm["max_seq_len"].dump() + " tokens"), std::string::npos) << out;
  EXPECT_NE(out.find("  end tokens      " + llm["eos_token_ids"][0].dump() + " \""), std::string::npos)
      << out;
  EXPECT_NE(out.find("  chat template   none\n"), std::string::npos) << out;
  EXPECT_NE(out.find("  weights         int8\n"), std::string::npos) << out;
  EXPECT_NE(out.find("  sequences       1 at once; its cache "), std::string::npos) << out;
  // A model of several sequences says what its cache costs, a slot and all.
  auto slots = Entry(TestData("tiny_llm_slots.pt2"), "tiny_llm_slots/extra/aotid.json")["generate"];
  ASSERT_EQ(slots["max_sequences"], 4);
  ASSERT_EQ(Run({"add", TestData("tiny_llm_slots.pt2"), "--name", "slots"}, &out), 0) << out;
  ASSERT_EQ(Run({"show", "slots"}, &out), 0) << out;
  char line[128];
  const double per = slots["cache_bytes_per_sequence"].get<double>();
  std::snprintf(line, sizeof line,
                "  sequences       4 at once; its cache %.1f MB a sequence, %.1f MB in all\n", per / 1e6,
                4 * per / 1e6);
  EXPECT_NE(out.find(line), std::string::npos) << out;

  ASSERT_EQ(Run({"show", "enc", "--json"}, &out), 0) << out;
  EXPECT_EQ(json::parse(out)["versions"][0]["purpose"]["embeds"],
            json::parse(R"({"dimensions": 384, "pooling": "cls", "normalized": false, "max_tokens": 128,
                            "truncatable": true})"));
  ASSERT_EQ(Run({"show", "enc"}, &out), 0) << out;
  EXPECT_NE(
      out.find("  embeddings      384 dimensions (fewer on request), cls pooling, texts cut at 128 tokens\n"),
      std::string::npos)
      << out;
  ASSERT_EQ(Run({"show", "mlp"}, &out), 0) << out;
  EXPECT_NE(out.find("  task            tensors\n  weights         float32\n"), std::string::npos) << out;
}

// The help of `set` and the flags of `add` come from the settings table:
// every key is listed, and each has its flag.
// `set NAME threads=...`, even unchanged, removes the auto-thread timing
// recorded with the version's builds (the daemon then times it anew), and
// leaves other models' alone.
TEST_F(StoreCli, SettingThreadsRemovesTheRecordedTiming) {
  std::string out;
  ASSERT_EQ(Run({"add", TestData("mlp.pt2"), "--name", "mlp"}, &out), 0) << out;
  ASSERT_EQ(Run({"add", TestData("embed.pt2"), "--name", "embed"}, &out), 0) << out;
  auto record = [&](const std::string& file) {
    std::string dir = store_ + "/cache/" + *fs::Sha256File(TestData(file)) + "/model.cpu.fp";
    EXPECT_OK(fs::MakeDirs(dir));
    EXPECT_OK(fs::WriteFileAtomic(dir + "/threads.json", R"({"key": "k", "threads": 1})"));
    return dir + "/threads.json";
  };
  std::string mlp = record("mlp.pt2"), embed = record("embed.pt2");
  ASSERT_EQ(Run({"set", "mlp", "threads=auto"}, &out), 0) << out;  // auto already: only the timing goes
  EXPECT_NE(out.find("removed the recorded thread timing of 1 build"), std::string::npos) << out;
  EXPECT_EQ(out.find("nothing changed"), std::string::npos) << out;
  EXPECT_FALSE(fs::Exists(mlp));
  EXPECT_TRUE(fs::Exists(embed));
  ASSERT_EQ(Run({"events", "-n", "1"}, &out), 0) << out;
  EXPECT_NE(out.find("threads_retime"), std::string::npos) << out;
  ASSERT_EQ(Run({"set", "mlp", "threads=auto"}, &out), 0) << out;  // nothing left to remove
  EXPECT_NE(out.find("nothing changed"), std::string::npos) << out;
}

// `aotid sync DIR`: every .pt2 of a folder, named by its file, or as the
// folder's index.json says (with settings); again, nothing changes; a
// file that changed is the model's next version; an index naming a path
// out of the folder is refused with the store unchanged.
TEST_F(StoreCli, SyncFromAFolderAddsWhatChanged) {
  aotid::testing::TempDir folder;
  std::string dir = folder.path();
  ASSERT_OK(fs::WriteFileAtomic(dir + "/mlp.pt2", *fs::ReadFile(TestData("mlp.pt2"))));
  ASSERT_OK(fs::WriteFileAtomic(dir + "/embed.pt2", *fs::ReadFile(TestData("embed.pt2"))));
  ASSERT_OK(fs::WriteFileAtomic(dir + "/notes.txt", "not a package"));
  std::string out;
  ASSERT_EQ(Run({"sync", dir}, &out), 0) << out;
  EXPECT_NE(out.find("synced " + dir + "/embed.pt2 as embed:1"), std::string::npos) << out;
  EXPECT_NE(out.find("synced " + dir + "/mlp.pt2 as mlp:1"), std::string::npos) << out;
  ASSERT_EQ(Run({"sync", dir}, &out), 0) << out;
  EXPECT_NE(out.find("mlp.pt2 is up to date: mlp:1"), std::string::npos) << out;

  ASSERT_OK(fs::WriteFileAtomic(dir + "/mlp.pt2", *fs::ReadFile(TestData("mlp2.pt2"))));
  ASSERT_OK(fs::WriteFileAtomic(dir + "/index.json", R"({"models": [
      {"file": "mlp.pt2", "name": "mlp", "settings": {"max_batch_size": "4"}}]})"));
  ASSERT_EQ(Run({"sync", dir}, &out), 0) << out;
  EXPECT_NE(out.find("as mlp:2"), std::string::npos) << out;
  ASSERT_EQ(Run({"show", "mlp:2", "--json"}, &out), 0) << out;
  EXPECT_EQ(json::parse(out)["versions"][0]["settings"]["max_batch_size"], 4);

  ASSERT_EQ(Run({"ls", "--json"}, &out), 0) << out;
  std::string before = out;
  ASSERT_OK(
      fs::WriteFileAtomic(dir + "/index.json", R"({"models": [{"file": "../../etc/passwd", "name": "x"}]})"));
  EXPECT_NE(Run({"sync", dir}, &out), 0);
  EXPECT_NE(out.find("is not a file name in the folder"), std::string::npos) << out;
  ASSERT_EQ(Run({"ls", "--json"}, &out), 0) << out;
  EXPECT_EQ(out, before);

  // Two files for one model would replace each other at every sync.
  ASSERT_OK(fs::WriteFileAtomic(dir + "/index.json", R"({"models": [{"file": "mlp.pt2", "name": "a"},
      {"file": "embed.pt2", "name": "a"}]})"));
  EXPECT_NE(Run({"sync", dir}, &out), 0);
  EXPECT_NE(out.find("mlp.pt2 and embed.pt2 are both model 'a'"), std::string::npos) << out;
  ASSERT_EQ(Run({"ls", "--json"}, &out), 0) << out;
  EXPECT_EQ(out, before);

  // A bad file is an error of its own: the files after it are synced.
  ASSERT_OK(fs::RemoveAll(dir + "/index.json"));
  ASSERT_OK(fs::WriteFileAtomic(dir + "/junk.pt2", "not a package"));
  ASSERT_OK(fs::WriteFileAtomic(dir + "/zz.pt2", *fs::ReadFile(TestData("mlp.pt2"))));
  EXPECT_NE(Run({"sync", dir}, &out), 0);
  EXPECT_NE(out.find("junk.pt2"), std::string::npos) << out;
  EXPECT_NE(out.find("synced " + dir + "/zz.pt2 as zz:1"), std::string::npos) << out;
  EXPECT_NE(out.find("embed.pt2 is up to date: embed:1"), std::string::npos) << out;

  // A folder that is not there creates no store.
  aotid::testing::TempDir other;
  EXPECT_NE(RunAotid({"--store", other.path() + "/store", "sync", dir + "/nowhere"}, &out), 0);
  EXPECT_NE(out.find("is not a folder"), std::string::npos) << out;
  EXPECT_FALSE(fs::Exists(other.path() + "/store"));
}

// The same file added again is a version of its own, and add says so: it
// is often a slip.
TEST_F(StoreCli, AddingTheSameFileAgainSaysSo) {
  std::string out;
  ASSERT_EQ(Run({"add", TestData("mlp.pt2"), "--name", "mlp"}, &out), 0) << out;
  EXPECT_EQ(out.find("note: the same file"), std::string::npos) << out;
  ASSERT_EQ(Run({"add", TestData("mlp.pt2"), "--name", "twin"}, &out), 0) << out;
  EXPECT_NE(out.find("added twin:1"), std::string::npos) << out;
  EXPECT_NE(out.find("note: the same file as mlp:1 (stored once)"), std::string::npos) << out;
  ASSERT_EQ(Run({"add", TestData("mlp.pt2"), "--name", "mlp"}, &out), 0) << out;
  EXPECT_NE(out.find("note: the same file as mlp:1, twin:1 (stored once)"), std::string::npos) << out;
}

// A compiled package for a device this machine lacks is kept (the store may
// feed other machines), and add says at once why this one cannot serve it.
// (AOTID_CPU_ONLY: no device here, even on a machine with a GPU.)
TEST_F(StoreCli, AddOfAPackageForAMissingDeviceSaysWhy) {
  RunOptions no_gpu;
  no_gpu.env = {"AOTID_CPU_ONLY=the test says so"};
  std::string out;
  ASSERT_EQ(RunAotid(Args({"add", TestData("cuda_so.pt2"), "--name", "cuda"}), no_gpu, &out), 0) << out;
  EXPECT_NE(out.find("added cuda:1"), std::string::npos) << out;
  EXPECT_NE(
      out.find("warning: this machine cannot serve it: package was built for cuda; this machine has none "
               "(device 'cuda' is not available here: "),
      std::string::npos)
      << out;
}

// Inductor options are checked against this installation's torch before
// they are stored: an unknown one, or a value of the wrong type, is refused
// with the reason and changes nothing.
TEST_F(StoreCli, InductorOptionsAreCheckedBeforeTheyAreStored) {
  std::string out;
  ASSERT_EQ(Run({"add", TestData("mlp.pt2"), "--name", "mlp"}, &out), 0) << out;
  auto before = DirSnapshot(store_);
  EXPECT_NE(Run({"set", "mlp", "inductor.no_such_option=1"}, &out), 0) << out;
  EXPECT_NE(out.find("unknown inductor option 'no_such_option'"), std::string::npos) << out;
  EXPECT_NE(Run({"set", "mlp", "inductor.max_autotune=notabool"}, &out), 0) << out;
  EXPECT_NE(out.find("inductor option 'max_autotune' takes a bool (its default is False), not 'notabool'"),
            std::string::npos)
      << out;
  EXPECT_NE(Run({"add", TestData("embed.pt2"), "--name", "embed", "--inductor", "cpp.threads=2.5"}, &out), 0)
      << out;
  EXPECT_NE(out.find("'cpp.threads' takes an int"), std::string::npos) << out;
  EXPECT_EQ(DirSnapshot(store_), before);
  ASSERT_EQ(Run({"set", "mlp", "inductor.max_autotune=true"}, &out), 0) << out;
  ASSERT_EQ(Run({"show", "mlp", "--json"}, &out), 0) << out;
  EXPECT_EQ(json::parse(out)["versions"][0]["settings"]["inductor_options"],
            json::parse(R"({"max_autotune":true})"))
      << out;
}

// keep_alive: a duration, always or default, said back as `show` says it.
TEST_F(StoreCli, KeepAliveIsSetAndShownAsADuration) {
  std::string out;
  ASSERT_EQ(Run({"add", TestData("mlp.pt2"), "--name", "mlp"}, &out), 0) << out;
  auto before = DirSnapshot(store_);
  EXPECT_EQ(Run({"set", "mlp:1", "keep_alive=soon"}, &out), 5);
  EXPECT_NE(out.find("keep_alive must be a duration (0, 90s, 5m, 2h), always or default, got 'soon'"),
            std::string::npos)
      << out;
  EXPECT_EQ(DirSnapshot(store_), before);
  ASSERT_EQ(Run({"show", "mlp:1"}, &out), 0) << out;
  EXPECT_NE(out.find(" max_sequences=auto keep_alive=default\n"), std::string::npos) << out;
  ASSERT_EQ(Run({"set", "mlp:1", "keep_alive=300"}, &out), 0) << out;
  EXPECT_NE(out.find("set mlp:1 keep_alive default -> 5m"), std::string::npos) << out;
  ASSERT_EQ(Run({"show", "mlp:1"}, &out), 0) << out;
  EXPECT_NE(out.find(" keep_alive=5m\n"), std::string::npos) << out;
  ASSERT_EQ(Run({"show", "mlp:1", "--json"}, &out), 0) << out;
  EXPECT_EQ(json::parse(out)["versions"][0]["settings"]["keep_alive"], "5m") << out;
  ASSERT_EQ(Run({"set", "mlp", "keep_alive=-1"}, &out), 0) << out;
  EXPECT_NE(out.find("set mlp:1 keep_alive 5m -> always"), std::string::npos) << out;
  ASSERT_EQ(Run({"set", "mlp", "keep_alive=default"}, &out), 0) << out;
  EXPECT_NE(out.find("set mlp:1 keep_alive always -> default"), std::string::npos) << out;
  ASSERT_EQ(Run({"events", "--model", "mlp"}, &out), 0) << out;
  EXPECT_NE(out.find("keep_alive default -> 5m"), std::string::npos) << out;
}

TEST_F(StoreCli, SetHelpListsEveryKeyAndAddHasAFlagForEach) {
  std::string set_help, add_help;
  ASSERT_EQ(Run({"set", "--help"}, &set_help), 0) << set_help;
  ASSERT_EQ(Run({"add", "--help"}, &add_help), 0) << add_help;
  // A boolean's two flags say its default plainly (CLI11 once printed
  // "--fallback-cpu,--no-fallback-cpu{false}", read as "default false").
  EXPECT_NE(add_help.find("--fallback-cpu              Run on the CPU when the device cannot (default: on)"),
            std::string::npos)
      << add_help;
  EXPECT_EQ(add_help.find("{false}"), std::string::npos) << add_help;
  for (const auto& f : storage::VersionSettingFields()) {
    bool options = f.type == storage::SettingType::kOptions;
    std::string key = options ? std::string(f.prefix) + "<option>=" : std::string(f.key) + "=";
    EXPECT_NE(set_help.find("  " + key), std::string::npos) << key << " missing from:\n" << set_help;
    std::string flag =
        "--" + (options ? std::string(f.prefix.substr(0, f.prefix.size() - 1)) : std::string(f.key));
    std::replace(flag.begin(), flag.end(), '_', '-');
    EXPECT_NE(add_help.find(flag), std::string::npos) << flag << " missing from:\n" << add_help;
  }
  for (const char* model_key : {"version_policy=latest|all|pinned:VERSION", "enabled=true|false"}) {
    EXPECT_NE(set_help.find(model_key), std::string::npos) << set_help;
  }

  // The generated flags set what they name.
  std::string out;
  std::vector<std::string> add = {"add",
                                  TestData("mlp.pt2"),
                                  "--name",
                                  "mlp",
                                  "--device",
                                  "cpu",
                                  "--no-fallback-cpu",
                                  "--num-runners",
                                  "2",
                                  "--max-batch-size",
                                  "4",
                                  "--max-batch-delay-us",
                                  "50",
                                  "--threads",
                                  "3",
                                  "--max-sequences",
                                  "2",
                                  "--keep-alive",
                                  "90s",
                                  "--inductor",
                                  "cpp.simdlen=8",
                                  "--inductor",
                                  "freezing=true"};
  ASSERT_EQ(Run(add, &out), 0) << out;
  ASSERT_EQ(Run({"show", "mlp:1"}, &out), 0) << out;
  std::string settings =
      "settings        device=cpu fallback_cpu=false num_runners=2 max_batch_size=4 "
      R"(max_batch_delay_us=50 threads=3 timeout_s=default memory_limit_mb=default max_sequences=2 )"
      R"(keep_alive=90s inductor={"cpp.simdlen":8,"freezing":true})";
  EXPECT_NE(out.find(settings), std::string::npos) << out;
  EXPECT_NE(add_help.find("--keep-alive DURATION=default"), std::string::npos) << add_help;
  EXPECT_EQ(Run({"add", TestData("mlp.pt2"), "--name", "mlp", "--keep-alive", "soon"}, &out), 2);
  EXPECT_NE(
      out.find("--keep-alive: keep_alive must be a duration (0, 90s, 5m, 2h), always or default, got 'soon'"),
      std::string::npos)
      << out;
  EXPECT_EQ(Run({"add", TestData("mlp.pt2"), "--name", "mlp", "--inductor", "=1"}, &out), 5);
  EXPECT_NE(out.find("--inductor '=1' is not KEY=VALUE"), std::string::npos) << out;
}

TEST_F(StoreCli, EventsFollowPrintsEventsFromOtherProcesses) {
  std::string out;
  ASSERT_EQ(Run({"add", TestData("mlp.pt2"), "--name", "first"}, &out), 0) << out;
  std::string follow_out = dir_ / "follow.out";
  auto pid = SpawnAotid(Args({"events", "--follow", "--json", "-n", "0"}), follow_out);
  ASSERT_TRUE(pid.ok());
  // It prints what comes after its starting point, which it takes as it
  // starts; a model added before then is not printed, so add (at most 10)
  // until one is.
  bool seen = false;
  for (int i = 0; i < 10 && !seen; ++i) {
    ASSERT_EQ(Run({"add", TestData("embed.pt2"), "--name", "second" + std::to_string(i)}, &out), 0) << out;
    seen = PollUntil(
        [&] { return fs::ReadFile(follow_out).value_or("").find("\"model\":\"second") != std::string::npos; },
        i == 9 ? 10 : 1);
  }
  ::kill(*pid, SIGTERM);
  EXPECT_EQ(WaitExitFor(*pid, 10), 0) << "events --follow did not stop on SIGTERM";
  std::string printed = *fs::ReadFile(follow_out);
  EXPECT_TRUE(seen) << printed;
  EXPECT_EQ(printed.find("\"model\":\"first\""), std::string::npos) << "-n 0 printed old events: " << printed;
}

TEST_F(StoreCli, ConcurrentAddsAllSucceedOrFailCleanly) {
  // Eight writers race to create the store and number their versions; four
  // more race for one explicit version, which exactly one may get.
  std::vector<std::pair<pid_t, std::string>> procs;
  for (int i = 0; i < 12; ++i) {
    std::string out = dir_ / ("add" + std::to_string(i) + ".out");
    std::vector<std::string> args =
        i < 8 ? std::vector<std::string>{"add", TestData(i % 2 ? "mlp.pt2" : "embed.pt2"), "--name", "race"}
              : std::vector<std::string>{"add", TestData("mlp.pt2"), "--name", "pinned", "--version", "7"};
    auto pid = SpawnAotid(Args(args), out);
    ASSERT_TRUE(pid.ok());
    procs.emplace_back(*pid, out);
  }
  int ok = 0, exists = 0;
  for (auto& [pid, out] : procs) {
    int code = WaitExitFor(pid, 120);
    std::string text = fs::ReadFile(out).value_or("");
    if (code == 0) {
      ++ok;
    } else {
      EXPECT_EQ(code, 4) << text;
      EXPECT_NE(text.find("already has version 7"), std::string::npos) << text;
      ++exists;
    }
  }
  EXPECT_EQ(ok, 9);
  EXPECT_EQ(exists, 3);
  auto store = storage::ModelStore::Open(store_, false);
  ASSERT_TRUE(store.ok());
  auto race = (*store)->GetModel("race");
  ASSERT_TRUE(race.ok());
  std::set<int64_t> versions;
  for (const auto& v : race->versions) versions.insert(v.version);
  EXPECT_EQ(versions, (std::set<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(FilesIn(store_ + "/blobs/sha256").size(), 2u);  // two distinct files, stored once each
  EXPECT_TRUE(FilesIn(store_ + "/blobs/tmp").empty());
  ExpectStoreConsistent(store_);
}

// kill -9 at each point of an add: nothing half-added is visible, gc clears
// what is left, and the same add then succeeds.
TEST_F(StoreCli, KilledAddLeavesNothingGcCannotClear) {
  std::string out;
  ASSERT_EQ(Run({"add", TestData("embed.pt2"), "--name", "keep"}, &out), 0) << out;
  std::string embed_sha = *fs::Sha256File(TestData("embed.pt2"));
  std::string mlp_sha = *fs::Sha256File(TestData("mlp.pt2"));
  struct Case {
    std::string point, file, sha;
  } cases[] = {
      {"add:copied", TestData("mlp.pt2"), mlp_sha},             // partial copy in blobs/tmp
      {"add:before_commit", TestData("mlp.pt2"), mlp_sha},      // blob renamed in, rows not committed
      {"add:before_commit", TestData("embed.pt2"), embed_sha},  // the blob is shared with 'keep'
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.point + " " + c.file);
    RunOptions crash;
    crash.env = {"AOTID_TEST_CRASH_AT=" + c.point};
    EXPECT_EQ(RunAotid(Args({"add", c.file, "--name", "victim"}), crash, &out), 128 + SIGKILL) << out;
    EXPECT_EQ(out.find("added"), std::string::npos) << out;
    EXPECT_EQ(Run({"show", "victim"}, &out), 3) << out;  // no trace in the store's rows
    ExpectStoreConsistent(store_);

    ASSERT_EQ(Run({"gc"}, &out), 0) << out;
    EXPECT_TRUE(FilesIn(store_ + "/blobs/tmp").empty()) << out;
    EXPECT_EQ(FilesIn(store_ + "/blobs/sha256"), std::vector<std::string>{embed_sha}) << out;
    ExpectStoreConsistent(store_);

    ASSERT_EQ(Run({"add", c.file, "--name", "victim"}, &out), 0) << out;
    ExpectStoreConsistent(store_);
    ASSERT_EQ(Run({"rm", "victim"}, &out), 0) << out;
    ASSERT_EQ(Run({"gc"}, &out), 0) << out;
  }
}

// kill -9 of gc between removing the rows and deleting the files: the
// blobs left behind are orphans, which the next gc removes.
TEST_F(StoreCli, KilledGcLeavesOnlyWhatTheNextGcClears) {
  std::string out;
  ASSERT_EQ(Run({"add", TestData("mlp.pt2"), "--name", "gone"}, &out), 0) << out;
  ASSERT_EQ(Run({"add", TestData("embed.pt2"), "--name", "kept"}, &out), 0) << out;
  ASSERT_EQ(Run({"rm", "gone"}, &out), 0) << out;
  RunOptions crash;
  crash.env = {"AOTID_TEST_CRASH_AT=gc:rows_removed"};
  EXPECT_EQ(RunAotid(Args({"gc"}), crash, &out), 128 + SIGKILL) << out;
  ExpectStoreConsistent(store_);
  std::string mlp_sha = *fs::Sha256File(TestData("mlp.pt2"));
  std::string embed_sha = *fs::Sha256File(TestData("embed.pt2"));
  EXPECT_TRUE(fs::Exists(store_ + "/blobs/sha256/" + mlp_sha));  // the row went, the file stayed
  ASSERT_EQ(Run({"gc"}, &out), 0) << out;
  EXPECT_NE(out.find("removed orphan blob sha256:" + mlp_sha), std::string::npos) << out;
  EXPECT_EQ(FilesIn(store_ + "/blobs/sha256"), std::vector<std::string>{embed_sha});
  ExpectStoreConsistent(store_);
}

TEST_F(StoreCli, BadInputIsRefusedWithReasonAndStoreUnchanged) {
  std::string out;
  ASSERT_EQ(Run({"add", TestData("mlp.pt2"), "--name", "mlp", "--version", "3"}, &out), 0) << out;
  std::string truncated = dir_ / "truncated.pt2";
  std::string whole = *fs::ReadFile(TestData("mlp.pt2"));
  ASSERT_OK(fs::WriteFileAtomic(truncated, whole.substr(0, whole.size() / 2)));
  struct Case {
    std::vector<std::string> args;
    int code;
    std::string needle;
  } cases[] = {
      {{"add", TestData("not_a_model.pt2"), "--name", "x"}, 5, "not a .pt2 package"},
      {{"add", truncated, "--name", "x"}, 5, "not a .pt2 package"},
      {{"add", TestData("empty.pt2"), "--name", "x"}, 5, "holds no model"},
      {{"add", TestData("mlp.pt2"), "--name", "../evil"}, 5, "may only contain letters"},
      {{"add", TestData("mlp.pt2"), "--name", "a\nb"}, 5, "model name 'a\\x0ab'"},
      {{"add", TestData("mlp.pt2"), "--name", "_x"}, 5, "must start with a letter or digit"},
      {{"add", TestData("mlp.pt2"), "--name", "mlp", "--version", "3"}, 4, "already has version 3"},
      {{"add", TestData("mlp.pt2"), "--name", "mlp", "--version", "0"}, 5, "version must be an integer"},
      {{"add", TestData("mlp.pt2"), "--name", "mlp", "--package-model", "other"}, 3, "has no model 'other'"},
      {{"add", TestData("mlp.pt2"), "--name", "x", "--device", "tpu"}, 5, "device 'tpu' is not one of"},
      {{"add", dir_ / "missing.pt2", "--name", "x"}, 3, "missing.pt2"},
      {{"show", "mlp:x"}, 5, "must be an integer"},
      {{"rm", "../mlp"}, 5, "may only contain letters"},
      {{"rm", "mlp:3", "nope"}, 3, "no model named 'nope'"},
  };
  for (const auto& c : cases) {
    auto before = DirSnapshot(store_);
    EXPECT_EQ(Run(c.args, &out), c.code) << c.args[0] << " " << c.args[1] << ": " << out;
    EXPECT_NE(out.find(c.needle), std::string::npos) << "expected '" << c.needle << "' in: " << out;
    EXPECT_EQ(DirSnapshot(store_), before) << c.args[0] << " " << c.args[1] << " changed the store";
  }
  ExpectStoreConsistent(store_);
}

TEST_F(StoreCli, StoreFileThatIsNotSqliteIsRefused) {
  ASSERT_OK(fs::MakeDirs(store_));
  ASSERT_OK(fs::WriteFileAtomic(store_ + "/aotid.db", std::string(4096, 'x')));
  auto before = DirSnapshot(store_);
  std::string out;
  EXPECT_EQ(Run({"add", TestData("mlp.pt2"), "--name", "mlp"}, &out), 1);
  EXPECT_NE(out.find("is not an SQLite database"), std::string::npos) << out;
  EXPECT_EQ(Run({"ls"}, &out), 1);
  EXPECT_NE(out.find("is not an SQLite database"), std::string::npos) << out;
  EXPECT_EQ(DirSnapshot(store_), before);
}

TEST_F(StoreCli, ReadOnlyStoreDirectoryIsRefusedAndUnchanged) {
  std::string out;
  ASSERT_EQ(Run({"add", TestData("mlp.pt2"), "--name", "mlp"}, &out), 0) << out;
  auto before = DirSnapshot(store_);
  std::vector<std::string> dirs;
  for (auto& e : stdfs::recursive_directory_iterator(store_)) {
    if (e.is_directory()) dirs.push_back(e.path().string());
  }
  dirs.push_back(store_);
  for (const auto& d : dirs) ::chmod(d.c_str(), 0555);
  RunOptions ro;
  ro.obey_file_modes = true;
  int add = RunAotid(Args({"add", TestData("embed.pt2"), "--name", "embed"}), ro, &out);
  std::string add_out = out;
  int rm = RunAotid(Args({"rm", "mlp"}), ro, &out);
  std::string rm_out = out;
  for (const auto& d : dirs) ::chmod(d.c_str(), 0755);
  EXPECT_NE(add, 0) << add_out;
  EXPECT_NE(add_out.find("the store directory " + store_ + " is read-only"), std::string::npos) << add_out;
  EXPECT_NE(rm, 0) << rm_out;
  EXPECT_NE(rm_out.find("readonly database"), std::string::npos) << rm_out;
  EXPECT_EQ(DirSnapshot(store_), before);
  ExpectStoreConsistent(store_);
}

// Root adding to a store another user owns (the system service's, run as
// its own user): every file root made is handed to that user, who can then
// add and remove as before.
TEST_F(StoreCli, RootsChangesToAnotherUsersStoreStayThatUsers) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root: it adds as root to a store of another user";
  ASSERT_EQ(::mkdir(store_.c_str(), 0700), 0);
  ASSERT_EQ(::chown(dir_.path().c_str(), 65534, 65534), 0);
  ASSERT_EQ(::chown(store_.c_str(), 65534, 65534), 0);
  std::string out;
  ASSERT_EQ(Run({"add", TestData("mlp.pt2"), "--name", "mlp"}, &out), 0) << out;
  ASSERT_EQ(Run({"set", "mlp", "max_batch_size=4"}, &out), 0) << out;
  int files = 0;
  for (auto& e : stdfs::recursive_directory_iterator(store_)) {
    struct stat st;
    ASSERT_EQ(::lstat(e.path().c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, 65534u) << e.path() << " is owned by " << st.st_uid;
    ++files;
  }
  EXPECT_GE(files, 4) << "aotid.db, blobs/, the blob, the lock";
  // The owner goes on using it.
  RunOptions as_owner;
  as_owner.uid = 65534;
  EXPECT_EQ(RunAotid(Args({"add", TestData("embed.pt2"), "--name", "embed"}), as_owner, &out), 0) << out;
  EXPECT_EQ(RunAotid(Args({"rm", "mlp"}), as_owner, &out), 0) << out;
  EXPECT_EQ(RunAotid(Args({"gc"}), as_owner, &out), 0) << out;
  ExpectStoreConsistent(store_);
}

// A build row left "building" by a daemon that was killed is shown as
// interrupted, not as a build still going; with a daemon holding the
// store's lock it is shown as the store says, and doctor says where that
// daemon serves.
TEST_F(StoreCli, BuildsOfAGoneDaemonShowAsInterrupted) {
  std::string out;
  ASSERT_EQ(Run({"add", TestData("mlp.pt2"), "--name", "mlp"}, &out), 0) << out;
  Run({"doctor"}, &out);  // this machine's fingerprint, as builds are keyed
  size_t at = out.find("fingerprint");
  ASSERT_NE(at, std::string::npos) << out;
  std::string line = out.substr(at, out.find('\n', at) - at);
  std::string fp = line.substr(line.find_last_of(' ') + 1);
  {
    auto store = storage::ModelStore::Open(store_, /*create=*/false);
    ASSERT_TRUE(store.ok());
    storage::BuildRecord b;
    b.artifact = *fs::Sha256File(TestData("mlp.pt2"));
    b.fingerprint = fp;
    b.device = "cpu";
    b.state = storage::BuildState::kBuilding;
    b.progress = "step 3/4: compiling for cpu (5 s)";
    b.attempts = 1;
    ASSERT_OK((*store)->PutBuild(b));
  }
  ASSERT_EQ(Run({"ls"}, &out), 0) << out;
  EXPECT_NE(out.find("interrupted"), std::string::npos) << out;
  EXPECT_EQ(out.find("step 3/4"), std::string::npos) << out;
  ASSERT_EQ(Run({"show", "mlp"}, &out), 0) << out;
  EXPECT_NE(out.find("the next `aotid serve` builds it again"), std::string::npos) << out;

  // A daemon holds the lock (this test stands in for it).
  int lock = ::open((store_ + "/daemon.lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_EQ(::flock(lock, LOCK_EX | LOCK_NB), 0);
  std::string announce = "4242\nhttp://127.0.0.1:18765\n";
  ASSERT_EQ(::write(lock, announce.data(), announce.size()), static_cast<ssize_t>(announce.size()));
  ASSERT_EQ(Run({"ls"}, &out), 0) << out;
  EXPECT_NE(out.find("building"), std::string::npos) << out;
  EXPECT_NE(out.find("step 3/4"), std::string::npos) << out;
  Run({"doctor"}, &out);
  EXPECT_NE(out.find("running on this store (pid 4242), serving on http://127.0.0.1:18765"),
            std::string::npos)
      << out;
  ::close(lock);
}

TEST_F(StoreCli, DoctorChecksTheToolchainAndSaysWhatToFix) {
  std::string out;
  ASSERT_EQ(Run({"add", TestData("mlp.pt2"), "--name", "mlp"}, &out), 0) << out;
  ASSERT_EQ(Run({"doctor"}, &out), 0) << out;
  const std::string schema = "(schema " + std::to_string(storage::kSchemaVersion) + ", 1 model)";
  for (const std::string& want :
       {std::string("fingerprint"), std::string("vector isa"), std::string("OK    compiler"),
        std::string("OK    python"), std::string("OK    compile worker"), std::string("OK    torch runtime"),
        schema, std::string("everything aotid needs is in place")}) {
    EXPECT_NE(out.find(want), std::string::npos) << want << " missing from:\n" << out;
  }
  ASSERT_OK(fs::WriteFileAtomic(dir_ / "broken.toml",
                                "[build]\npython = \"/nonexistent/python3\"\ncxx = \"/nonexistent/c++\"\n"));
  EXPECT_EQ(RunAotid({"--config", dir_ / "broken.toml", "--store", store_, "doctor"}, &out), 1) << out;
  EXPECT_NE(out.find("FAIL  python           /nonexistent/python3 does not exist"), std::string::npos) << out;
  EXPECT_NE(out.find("fix: set build.python"), std::string::npos) << out;
  EXPECT_NE(out.find("FAIL  compiler"), std::string::npos) << out;
  EXPECT_NE(out.find("2 check(s) failed"), std::string::npos) << out;
  RunOptions no_plugin;
  no_plugin.env = {"AOTID_TORCH_PLUGIN=" + (dir_ / "nowhere.so")};
  EXPECT_EQ(RunAotid(Args({"doctor"}), no_plugin, &out), 1) << out;
  EXPECT_NE(out.find("FAIL  torch runtime"), std::string::npos) << out;
  EXPECT_NE(out.find("nowhere.so: no such file"), std::string::npos) << out;

  // The sandbox runners get here is named: this Linux kernel has both
  // layers; macOS has neither (rlimits only, docs/RUNNERS.md), a warning.
  ASSERT_EQ(Run({"doctor"}, &out), 0) << out;
#ifdef __linux__
  EXPECT_NE(out.find("OK    runner sandbox   landlock ABI "), std::string::npos) << out;
#else
  EXPECT_NE(out.find("WARN  runner sandbox   no landlock"), std::string::npos) << out;
#endif
  // A version whose package is gone from the store cannot be built again.
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(store_ + "/blobs/sha256", ec)) {
    std::filesystem::remove(e.path(), ec);
  }
  EXPECT_EQ(Run({"doctor"}, &out), 1) << out;
  EXPECT_NE(out.find("FAIL  blob             mlp:1's package"), std::string::npos) << out;
  EXPECT_NE(out.find("is missing"), std::string::npos) << out;
}

// On a full disk aotid can still show the store and free space: the
// store's reserve is given back when the disk is full. A real full file
// system: a 64 MiB tmpfs in a mount namespace of its own (no root needed),
// filled to the last byte. Linux only: macOS has no unprivileged mount
// namespace (nor unshare, tmpfs or df --output) to make one with.
#ifdef __linux__
TEST_F(StoreCli, ReadRmAndGcWorkOnAFullDisk) {
  std::string mnt = dir_ / "mnt", script = dir_ / "full.sh", out_path = dir_ / "full.out";
  ASSERT_OK(fs::MakeDirs(mnt));
  std::string a = AOTID_BINARY, s = mnt + "/store";
  ASSERT_OK(fs::WriteFileAtomic(script,
                                "set -u\n"
                                "mount -t tmpfs -o size=64M tmpfs " +
                                    mnt +
                                    " || { echo 'cannot mount'; exit 9; }\n"
                                    "A=" +
                                    a + "; S=" + s +
                                    "\n"
                                    "$A --store $S add " +
                                    TestData("mlp.pt2") +
                                    " --name a >/dev/null || exit 8\n"
                                    "$A --store $S add " +
                                    TestData("mlp2.pt2") +
                                    " --name b >/dev/null || exit 8\n"
                                    "test -f $S/reserve && echo 'reserve set aside'\n"
                                    "dd if=/dev/zero of=" +
                                    mnt +
                                    "/filler bs=1M count=100 2>/dev/null\n"
                                    "echo \"free: $(df --output=avail -B1 " +
                                    mnt +
                                    " | tail -1 | tr -d ' ')\"\n"
                                    "$A --store $S ls; echo \"ls: $?\"\n"
                                    "$A --store $S show a >/dev/null; echo \"show: $?\"\n"
                                    "$A --store $S rm b; echo \"rm: $?\"\n"
                                    "$A --store $S gc; echo \"gc: $?\"\n"
                                    "$A --store $S ls; echo \"ls again: $?\"\n"));
  std::string cmd = "unshare --user --map-root-user --mount bash " + script + " >" + out_path + " 2>&1";
  int rc = std::system(cmd.c_str());
  std::string out = fs::ReadFile(out_path).value_or("");
  ASSERT_EQ(rc, 0) << out;
  for (const char* want :
       {"reserve set aside", "free: 0\n", "gave back the store's 8 MiB reserve", "ls: 0", "show: 0",
        "removed b (1 version)", "rm: 0", "removed 1 blobs", "gc: 0", "ls again: 0"}) {
    EXPECT_NE(out.find(want), std::string::npos) << want << " missing from:\n" << out;
  }
  EXPECT_EQ(out.find("disk I/O error"), std::string::npos) << out;
}
#endif  // __linux__

}  // namespace
}  // namespace aotid::testing
