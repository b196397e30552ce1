// POST /v1/embeddings: a request's texts tokenized, cut into chunks, each
// chunk padded and run through the model's queue (where it may join other
// requests' chunks, serving/batcher.h), the rows gathered back in order.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>

#include "base/mutex.h"
#include "serving/embeddings.h"
#include "serving/openai.h"

namespace aotid::serving {
namespace {

constexpr char kJson[] = "application/json";

// A chunk of one request: at most this many texts, and this many tokens
// once padded (what a run's attention costs grows with rows x longest²).
constexpr size_t kChunkRows = 32;
constexpr int64_t kChunkTokens = 8192;

// What one request's chunks share while they run.
struct EmbedJob {
  std::shared_ptr<const ServedModel> sm;
  EmbeddingsRequest request;
  int64_t prompt_tokens = 0;
  std::vector<float> vectors;  // [inputs, dim], in the request's order
  std::chrono::steady_clock::time_point start;
  http::Reply reply;
  Metrics* metrics = nullptr;
  std::optional<Metrics::InFlight> in_flight;  // counted while it is being answered

  Mutex mu;
  size_t pending GUARDED_BY(mu) = 0;  // chunks not yet back
  Status error GUARDED_BY(mu);        // the first chunk's failure
  double compute_s GUARDED_BY(mu) = 0;
};

// The rows of each chunk, as indexes into the request's inputs: longest
// first, so that a chunk's rows are of like length and little is padded
// (as sentence-transformers sorts its batches).
std::vector<std::vector<size_t>> Chunks(const std::vector<std::vector<int32_t>>& ids, size_t max_rows) {
  std::vector<size_t> order(ids.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return ids[a].size() > ids[b].size(); });
  std::vector<std::vector<size_t>> chunks;
  for (size_t i : order) {
    // Sorted longest first: a chunk's first row is its longest.
    if (chunks.empty() || chunks.back().size() >= max_rows ||
        static_cast<int64_t>((chunks.back().size() + 1) * ids[chunks.back().front()].size()) > kChunkTokens) {
      chunks.emplace_back();
    }
    chunks.back().push_back(i);
  }
  return chunks;
}

// The model's inputs for one chunk, in the order its spec lists them.
std::vector<model::HostTensor> ChunkInputs(const ServedModel& sm,
                                           const std::vector<std::vector<int32_t>>& rows) {
  const EmbedSpec& spec = *sm.embed;
  PaddedBatch b = PadBatch(rows, spec.pad_id);
  std::vector<model::HostTensor> inputs;
  for (const auto& in : sm.model->spec().inputs) {
    const std::vector<int64_t>& values = in.name == spec.ids_input ? b.input_ids : b.attention_mask;
    model::HostTensor t{in.name, model::DType::kInt64, {b.rows, b.seq}, {}};
    t.data.resize(values.size() * sizeof(int64_t));
    std::memcpy(t.data.data(), values.data(), t.data.size());
    inputs.push_back(std::move(t));
  }
  return inputs;
}

// Puts a chunk's vectors into the request's rows; Internal when the model
// answered something else than its spec promised.
Status Gather(EmbedJob& job, const std::vector<size_t>& rows, const std::vector<model::HostTensor>& outputs) {
  const EmbedSpec& spec = *job.sm->embed;
  const auto n = static_cast<int64_t>(rows.size());
  for (const auto& t : outputs) {
    if (t.name != spec.output) continue;
    if (t.dtype != model::DType::kFloat32 || t.shape != std::vector<int64_t>{n, spec.dim} ||
        t.data.size() != static_cast<size_t>(n * spec.dim) * sizeof(float)) {
      return Internal("the model's output '" + t.name + "' is " + std::string(model::DTypeName(t.dtype)) +
                      " " + model::ShapeString(t.shape) + " for " + std::to_string(n) + " texts, not FP32 [" +
                      std::to_string(n) + ", " + std::to_string(spec.dim) + "]");
    }
    const auto* src = reinterpret_cast<const float*>(t.data.data());
    for (size_t r = 0; r < rows.size(); ++r) {
      std::copy_n(src + r * static_cast<size_t>(spec.dim), spec.dim,
                  job.vectors.begin() + static_cast<std::ptrdiff_t>(rows[r] * static_cast<size_t>(spec.dim)));
    }
    return Status::OK();
  }
  return Internal("the model gave no output '" + spec.output + "'");
}

// Answers once every chunk is back.
void Answer(const std::shared_ptr<EmbedJob>& job) {
  job->reply([job](http::Response& res) {
    const ServedModel& sm = *job->sm;
    const double total_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - job->start).count();
    Status error;
    double compute_s = 0;
    {
      MutexLock lock(&job->mu);
      error = job->error;
      compute_s = job->compute_s;
    }
    if (!error.ok()) {
      OpenAiError e = OpenAiErrorFor(error);
      if (e.status == 503) res.SetHeader("Retry-After", "1");
      res.status = e.status;
      res.Set(OpenAiErrorBody(e), kJson);
    } else {
      auto body = EmbeddingsResponseJson(job->vectors.data(), static_cast<int64_t>(job->request.size()),
                                         sm.embed->dim, job->request, *sm.embed, job->request.model,
                                         job->prompt_tokens);
      if (body.ok()) {
        res.status = 200;
        res.Set(std::move(body).value(), kJson);
      } else {
        res.status = 500;
        res.Set(OpenAiErrorBody({500, body.status().message(), "", ""}), kJson);
      }
    }
    if (job->metrics) job->metrics->RecordInfer(sm.name, sm.version, res.status, total_s, compute_s);
  });
}

void Embeddings(const ModelRegistry* registry, Metrics* metrics, const http::Request& req,
                http::Response& res) {
  auto send = [&](const OpenAiError& e) {
    res.status = e.status;
    res.Set(OpenAiErrorBody(e), kJson);
  };
  auto job = std::make_shared<EmbedJob>();
  job->start = std::chrono::steady_clock::now();
  job->metrics = metrics;
  EmbeddingsError bad;
  auto request = ParseEmbeddingsRequest(req.body, &bad);
  if (!request.ok()) return send({400, bad.message, bad.param, ""});
  job->request = std::move(request).value();
  OpenAiError err;
  job->sm = ReadyModel(registry, job->request.model, res, &err);
  if (!job->sm) return send(err);
  const ServedModel& sm = *job->sm;
  // Counted from here as /v2's infer requests are: its refusals too.
  if (metrics) job->in_flight.emplace(metrics);
  auto refuse = [&](const OpenAiError& e) {
    send(e);
    if (metrics) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - job->start).count();
      metrics->RecordInfer(sm.name, sm.version, e.status, s, 0);
    }
  };
  if (!sm.embed) {
    return refuse({400,
                   "model '" + job->request.model + "' does not embed text" +
                       (sm.generator ? ": it generates text, through /v1/chat/completions and /v1/completions"
                                     : ": it serves tensors through /v2/models/" + sm.name + "/infer"),
                   "model", ""});
  }
  // A model that batches may wait for this request while it is tokenized.
  std::unique_ptr<model::Announcement> announced = sm.model->Announce();
  auto ids = TokenizeEmbeddingInputs(job->request, *sm.embed, &bad);
  if (!ids.ok()) return refuse({400, bad.message, bad.param, ""});
  for (const auto& row : *ids) job->prompt_tokens += static_cast<int64_t>(row.size());
  job->vectors.resize(ids->size() * static_cast<size_t>(sm.embed->dim));
  // A chunk holds at most the rows the version batches (its max_batch_size,
  // so that chunks of several requests join), and never more than the
  // model was compiled for.
  size_t max_rows =
      sm.model->max_batch_rows() > 1 ? static_cast<size_t>(sm.model->max_batch_rows()) : kChunkRows;
  for (const auto& in : sm.model->spec().inputs) {
    if (!in.dims.empty() && in.dims[0])
      max_rows = std::min<size_t>(max_rows, std::max<int64_t>(1, in.dims[0]->max));
  }
  std::vector<std::vector<size_t>> chunks = Chunks(*ids, max_rows);
  {
    MutexLock lock(&job->mu);
    job->pending = chunks.size();
  }
  job->reply = res.Defer();
  int fd = req.connection_fd;
  for (auto& rows : chunks) {
    std::vector<std::vector<int32_t>> chunk_ids;
    for (size_t i : rows) chunk_ids.push_back((*ids)[i]);
    model::RunContext run;
    if (fd >= 0) run.cancelled = [fd] { return http::ClientGone(fd); };
    const auto run_start = std::chrono::steady_clock::now();
    auto done = [job, rows = std::move(rows), run_start](StatusOr<std::vector<model::HostTensor>> out) {
      const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
      Status s = out.ok() ? Gather(*job, rows, *out) : out.status();
      bool last = false;
      {
        MutexLock lock(&job->mu);
        if (job->error.ok() && !s.ok()) job->error = s;
        job->compute_s = std::max(job->compute_s, took);
        last = --job->pending == 0;
      }
      if (last) Answer(job);
    };
    // After a chunk was refused (a full queue), the rest are not queued.
    Status failed;
    {
      MutexLock lock(&job->mu);
      failed = job->error;
    }
    if (!failed.ok()) {
      done(failed);
      continue;
    }
    Status queued = sm.model->Submit(ChunkInputs(sm, chunk_ids), std::move(run), done, std::move(announced));
    if (!queued.ok()) done(queued);
  }
}

}  // namespace

void AddEmbeddingsRoute(http::Router& router, const ModelRegistry* registry, Metrics* metrics) {
  router.Add("POST", "/v1/embeddings", [registry, metrics](const http::Request& req, http::Response& res) {
    Embeddings(registry, metrics, req, res);
  });
}

}  // namespace aotid::serving
