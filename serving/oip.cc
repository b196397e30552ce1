#include "serving/oip.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <utility>

#include "storage/model_store.h"

namespace aotid::serving {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Why a model the store has is not served at all: Unavailable for one
// that is unloaded, NotFound for a name the store does not know.
Status NotServed(const ModelRegistry* registry, const std::string& name) {
  for (const auto& e : *registry->GetCatalog()) {
    if (e.name == name && !e.enabled) {
      // Answered over HTTP and gRPC alike: each way back in is named.
      return Unavailable("model '" + name + "' is unloaded (a repository load serves it again: POST " +
                         "/v2/repository/models/" + name +
                         "/load, gRPC's RepositoryModelLoad, or `aotid set " + name + " enabled=true`)");
    }
  }
  return NotFound("unknown model '" + name + "'");
}

// Compares without stopping at the first difference, so the time taken
// says nothing about how much of a guess was right.
bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

// "Bearer " in any case (RFC 7235: the scheme is case-insensitive).
bool IsBearer(const std::string& auth) {
  if (auth.size() < 7 || auth[6] != ' ') return false;
  for (size_t i = 0; i < 6; ++i) {
    if (std::tolower(static_cast<unsigned char>(auth[i])) != "bearer"[i]) return false;
  }
  return true;
}

}  // namespace

std::vector<std::string> ServerExtensions() { return {"binary_tensor_data", "model_repository", "generate"}; }

StatusOr<std::shared_ptr<const ServedModel>> ResolveModel(const ModelRegistry* registry,
                                                          const std::string& name,
                                                          const std::string& version) {
  RETURN_IF_ERROR(storage::ValidateModelName(name));
  if (version.empty()) {
    auto m = registry->Find(name);
    if (!m) return NotServed(registry, name);
    return m;
  }
  std::string unused;
  std::optional<int64_t> v;
  RETURN_IF_ERROR(storage::ParseModelRef(name + ":" + version, &unused, &v));
  auto m = registry->Find(name, *v);
  if (m) return m;
  auto served = registry->All();
  auto it = served->find(name);
  if (it == served->end()) return NotServed(registry, name);
  std::string have;
  for (const auto& [n, sm] : it->second) have += (have.empty() ? "" : ", ") + std::to_string(n);
  return NotFound("model '" + name + "' has no served version " + version + " (serving: " + have + ")");
}

Status NotReady(const ServedModel& m) {
  std::string what = "model '" + m.name + "' version " + std::to_string(m.version);
  switch (m.state) {
    case ServeState::kQueued: return Unavailable(what + " is queued for its build; try again shortly");
    case ServeState::kLoading: return Unavailable(what + " is loading; try again shortly");
    case ServeState::kBuilding:
      return Unavailable(what + " is " + (m.message.empty() ? "building" : m.message) +
                         "; try again shortly");
    case ServeState::kFailed: return Unavailable(what + " failed: " + m.message);
    case ServeState::kReady: break;
  }
  return Unavailable(what + " is not ready");
}

Status AnswersNow(const ModelRegistry* registry, const ServedModel& m) {
  if (m.state != ServeState::kReady || !m.model) return NotReady(m);
  if (auto report = registry->GetResidency()) {
    for (const auto& v : report->versions) {
      if (v.name == m.name && v.version == m.version && !v.fits) return Unavailable(v.why_not);
    }
  }
  return Status::OK();
}

ServerReadiness CheckServerReady(const ModelRegistry* registry, bool needs_resident) {
  ServerReadiness r;
  auto report = needs_resident ? registry->GetResidency() : nullptr;
  // Its residency when that keeps it from answering at once; "" otherwise.
  auto not_loaded = [&report](const std::string& name, int64_t version) -> std::string {
    if (!report) return "";
    for (const auto& v : report->versions) {
      if (v.name == name && v.version == version) return v.state == "resident" ? "" : v.state;
    }
    return "not resident";
  };
  size_t wanted = 0;
  for (const auto& e : *registry->GetCatalog()) {
    if (!e.enabled || !e.wanted) continue;
    ++wanted;
    auto sm = registry->Find(e.name, e.version);
    std::string residency;
    if (sm && sm->state == ServeState::kReady) {
      residency = not_loaded(e.name, e.version);
      if (residency.empty()) continue;
    }
    if (++r.not_ready > 20) continue;
    r.waiting.push_back({e.name, e.version,
                         sm ? std::string(ServeStateName(sm->state)) : std::string("queued"), residency,
                         sm ? sm->message : std::string()});
  }
  // Where ready means "answers at once" (single-model mode), a server with
  // nothing to serve (its model unloaded) is not.
  const bool nothing = needs_resident && wanted == 0;
  r.ready = registry->startup_done() && r.not_ready == 0 && !nothing;
  if (!registry->startup_done()) {
    r.reason = "starting";
  } else if (nothing) {
    r.reason = "no model is served";
  }
  return r;
}

std::vector<RepositoryEntry> RepositoryIndex(const ModelRegistry* registry, bool only_ready) {
  std::vector<RepositoryEntry> out;
  for (const auto& e : *registry->GetCatalog()) {
    auto sm = registry->Find(e.name, e.version);
    std::string state = "UNAVAILABLE", reason;
    if (sm) {
      switch (sm->state) {
        case ServeState::kReady: state = "READY"; break;
        case ServeState::kFailed: reason = sm->message; break;
        default:
          state = "LOADING";
          reason = std::string(ServeStateName(sm->state));
          break;
      }
      if (!e.wanted && sm->state == ServeState::kReady) reason = "serving until a newer version is ready";
    } else {
      reason = !e.enabled ? "unloaded" : "not served by version policy '" + e.policy + "'";
    }
    if (only_ready && state != "READY") continue;
    out.push_back({e.name, e.version, state, reason});
  }
  return out;
}

TokenCheck CheckToken(const std::string& token, bool needed, const std::string* authorization) {
  if (token.empty() || !needed) return TokenCheck::kOk;
  if (!authorization || authorization->empty()) return TokenCheck::kMissing;
  if (!IsBearer(*authorization) || !ConstantTimeEquals(authorization->substr(7), token))
    return TokenCheck::kWrong;
  return TokenCheck::kOk;
}

InferRecord::InferRecord(Metrics* metrics, std::shared_ptr<const ServedModel> model)
    : metrics_(metrics), model_(std::move(model)), in_flight_(metrics) {}

void InferRecord::Answered(int http_status) {
  if (answered_.exchange(true)) return;
  metrics_->RecordInfer(model_->name, model_->version, http_status, SecondsSince(start_), compute_s_);
  in_flight_.Done();
}

void RunInfer(const ModelRegistry* registry, Metrics* metrics, const std::string& name,
              const std::string& version, const InferDecode& decode, std::function<bool()> gone,
              std::function<void(InferOutcome)> answer) {
  InferOutcome refused;
  auto m = ResolveModel(registry, name, version);
  if (!m.ok()) {
    refused.status = m.status();  // not counted: the name is the caller's, not a model
    return answer(std::move(refused));
  }
  std::shared_ptr<const ServedModel> sm = *m;
  refused.model = sm;
  refused.record = std::make_shared<InferRecord>(metrics, sm);
  if (sm->state != ServeState::kReady || !sm->model) {
    refused.status = NotReady(*sm);
    refused.retry_later = sm->state != ServeState::kFailed;
    return answer(std::move(refused));
  }
  // A model that batches is told a request is coming, so that a batch may
  // wait for it while it is decoded.
  std::unique_ptr<model::Announcement> announced = sm->generator ? nullptr : sm->model->Announce();
  auto decoded = decode(sm->model->spec());
  if (!decoded.ok()) {
    refused.status = decoded.status();
    return answer(std::move(refused));
  }
  // A request whose client has gone is not run (here, or by the batcher
  // when it forms the batch); it counts as 499, as nginx has it.
  if (gone && gone()) {
    refused.status = Cancelled(model::kClientGone);
    return answer(std::move(refused));
  }
  model::RunContext run;
  run.cancelled = std::move(gone);
  auto request = std::make_shared<InferRequest>(std::move(*decoded));
  std::vector<model::HostTensor> inputs = std::move(request->inputs);
  auto record = refused.record;
  const auto run_start = Clock::now();
  model::LoadedModel::Done done = [sm, request, record, run_start,
                                   answer](StatusOr<std::vector<model::HostTensor>> out) {
    record->SetComputeSeconds(SecondsSince(run_start));
    InferOutcome o;
    o.model = sm;
    o.request = request;
    o.record = record;
    if (out.ok()) {
      o.outputs = std::move(out).value();
    } else {
      o.status = out.status();
    }
    answer(std::move(o));
  };
  // Every model takes the run asynchronously: a language model's in turn
  // with its sequences (Generator::RunAlone), since its cache is inside
  // it; the others through LoadedModel::Submit.
  Status queued = sm->generator
                      ? sm->generator->RunAlone(sm->model, std::move(inputs), std::move(run), done)
                      : sm->model->Submit(std::move(inputs), std::move(run), done, std::move(announced));
  if (!queued.ok()) done(queued);
}

Status LoadParameterRefused(const std::string& name) {
  return InvalidArgument("load takes no parameters here ('" + name +
                         "' was given): a model's files and settings come from the store (aotid add, "
                         "aotid set)");
}

}  // namespace aotid::serving
