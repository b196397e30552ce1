// A client of the OCI distribution API (any registry: Docker's `registry`,
// Harbor, GHCR, Zot), for what `aotid push` and `aotid sync` need: blobs in
// and out, manifests in and out. docs/SYNC.md describes the artifacts.
//
// Everything a registry says is untrusted: a digest is used for anything
// (a URL, a file name) only after IsValidDigest, bodies are read up to
// limits, and a blob is trusted only once its bytes hash to its digest.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace aotid::sync {

// oci://HOST[:PORT]/REPO[:TAG]
struct OciRef {
  std::string host;  // as written ("[::1]" keeps its brackets)
  int port = 0;      // 0: the scheme's
  std::string repo;
  std::string tag;  // empty: none given
  bool plain_http = false;

  std::string Origin() const;    // "http://127.0.0.1:5000"
  std::string ToString() const;  // "oci://127.0.0.1:5000/models/mlp:stable"
};

// Parses a reference. Plain HTTP is allowed for loopback hosts
// (localhost, 127.0.0.0/8, ::1) or when `insecure` (a Registry still uses
// TLS there when the registry speaks it); TLS only otherwise.
StatusOr<OciRef> ParseOciRef(std::string_view text, bool insecure);

// "sha256:" and 64 lowercase hex digits, nothing else.
bool IsValidDigest(std::string_view digest);

struct RegistryLimits {
  int64_t max_manifest_bytes = 4 << 20;
  int64_t max_config_bytes = 1 << 20;
  int64_t max_layer_bytes = int64_t{64} << 30;
  int timeout_s = 30;  // connecting, and each read or write
};

struct Credentials {
  std::string user, password;  // empty user: anonymous
};

// The credentials for `ref`'s registry from a file of Docker's config
// format ({"auths": {"HOST[:PORT]": {"auth": base64("user:password")}}}, or
// "username" and "password"): `file`, else $DOCKER_CONFIG/config.json or
// ~/.docker/config.json when there is one. None (anonymous) when no entry
// names the registry.
StatusOr<Credentials> ReadCredentials(const std::string& file, const OciRef& ref);

// Bytes so far and the total, as a transfer goes.
using Progress = std::function<void(int64_t done, int64_t total)>;

// Text from elsewhere (a registry, a folder's index) made safe to print
// and log: control characters become '?', cut at 300 characters.
std::string Printable(std::string_view s);

// Closes the sockets of the requests in flight of every Registry made with
// `cancel` (set it first): one waiting on a silent registry ends at once,
// with an error, instead of at its read timeout.
void StopTransfers(const std::atomic<bool>* cancel);

class Registry {
 public:
  // `cancel`, when given, stops a download at its next chunk once set.
  Registry(OciRef ref, Credentials creds, RegistryLimits limits, const std::atomic<bool>* cancel = nullptr)
      : ref_(std::move(ref)), creds_(std::move(creds)), limits_(limits), cancel_(cancel) {}

  const OciRef& ref() const { return ref_; }

  // Whether the repository has the blob.
  StatusOr<bool> HasBlob(const std::string& digest);
  // Uploads a file whose sha256 is `digest` (one monolithic upload).
  Status PushBlob(const std::string& digest, const std::string& path, int64_t size, const Progress& progress);
  Status PushBlobBytes(const std::string& digest, const std::string& bytes);
  // Puts a manifest under `reference` (a tag); returns its digest.
  StatusOr<std::string> PutManifest(const std::string& reference, const std::string& media_type,
                                    const std::string& body);
  // The manifest of `reference` (a tag or digest), at most
  // max_manifest_bytes; checked against the digest when it is one.
  StatusOr<std::string> GetManifest(const std::string& reference);
  // The tags of the repository.
  StatusOr<std::vector<std::string>> ListTags();
  // A small blob (a config), at most `max_bytes`, checked against its digest.
  StatusOr<std::string> GetSmallBlob(const std::string& digest, int64_t max_bytes);
  // Downloads a blob of `size` bytes into `partial`, continuing what an
  // earlier, interrupted download left there (a Range request), then checks
  // its sha256. Returns how many bytes this call fetched. On a digest
  // mismatch the partial file is removed.
  StatusOr<int64_t> FetchBlob(const std::string& digest, int64_t size, const std::string& partial,
                              const Progress& progress);

 private:
  struct Answer;
  // One request with the registry's authentication (basic, or the bearer
  // token flow on a 401 challenge), following redirects for GETs.
  StatusOr<Answer> Call(const std::string& method, const std::string& path_or_url,
                        std::vector<std::pair<std::string, std::string>> headers, const std::string& body,
                        int64_t max_body,
                        const std::function<bool(int status, const char*, size_t)>& sink = nullptr);
  Status Authorize(const std::string& challenge);
  // Where plain HTTP is allowed (loopback, --insecure), TLS is still used
  // when the registry speaks it: asked once, before the first request.
  void PreferTls();

  OciRef ref_;
  bool tls_probed_ = false;
  Credentials creds_;
  RegistryLimits limits_;
  const std::atomic<bool>* cancel_;
  std::string bearer_;  // a token from the registry's realm, once one was asked for
};

}  // namespace aotid::sync
