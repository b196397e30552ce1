#include "serving/metrics.h"

#include <unistd.h>

#ifdef __APPLE__
#include <mach/mach.h>
#endif

#include <cstdio>

namespace aotid::serving {
namespace {

// Request latencies: 50 µs to 10 s.
std::vector<double> LatencyBounds() {
  return {50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3,
          50e-3, 100e-3, 250e-3, 500e-3, 1,    2.5,    5,    10};
}

std::string Num(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

}  // namespace

std::string MetricLabelValue(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

void AppendMetricHeader(std::string* out, const std::string& name, const std::string& type,
                        const std::string& help) {
  *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void Metrics::SetCollector(std::function<void(std::string*)> collect) {
  MutexLock lock(&mu_);
  collect_ = std::move(collect);
}

void Histogram::Observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::Write(std::string* out, const std::string& name, const std::string& labels) const {
  std::string sep = labels.empty() ? "" : ",";
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i];
    std::string le = i < bounds_.size() ? Num(bounds_[i]) : "+Inf";
    *out += name + "_bucket{" + labels + sep + "le=\"" + le + "\"} " + std::to_string(cumulative) + "\n";
  }
  std::string braces = labels.empty() ? "" : "{" + labels + "}";
  *out += name + "_sum" + braces + " " + Num(sum_) + "\n";
  *out += name + "_count" + braces + " " + std::to_string(count_) + "\n";
}

Metrics::Metrics() : build_duration_({1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1800}) {}

Metrics::ModelSeries& Metrics::Series(const std::string& model, int64_t version) {
  auto it = models_.find({model, version});
  if (it == models_.end()) {
    it = models_
             .emplace(std::make_pair(model, version),
                      ModelSeries{{},
                                  Histogram(LatencyBounds()),
                                  Histogram(LatencyBounds()),
                                  Histogram(LatencyBounds()),
                                  Histogram({1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096}),
                                  0,
                                  {},
                                  0,
                                  0,
                                  Histogram(LatencyBounds()),
                                  0,
                                  {},
                                  Histogram({0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60})})
             .first;
  }
  return it->second;
}

void Metrics::RecordInfer(const std::string& model, int64_t version, int status, double total_s,
                          double compute_s) {
  MutexLock lock(&mu_);
  ModelSeries& s = Series(model, version);
  ++s.requests_by_status[status];
  s.total.Observe(total_s);
  if (compute_s > 0) s.compute.Observe(compute_s);
}

void Metrics::RecordBatch(const std::string& model, int64_t version, int rows,
                          const std::vector<double>& queue_s) {
  MutexLock lock(&mu_);
  ModelSeries& s = Series(model, version);
  s.batch_rows.Observe(rows);
  for (double q : queue_s) s.queue.Observe(q);
}

void Metrics::RecordBuild(bool ok, double duration_s) {
  MutexLock lock(&mu_);
  ++(ok ? builds_ok_ : builds_failed_);
  build_duration_.Observe(duration_s);
}

void Metrics::RecordResidentLoad(const std::string& model, int64_t version, double wait_s) {
  MutexLock lock(&mu_);
  ModelSeries& s = Series(model, version);
  ++s.resident_loads;
  s.load_wait.Observe(wait_s);
}

void Metrics::RecordUnload(const std::string& model, int64_t version, const std::string& cause) {
  MutexLock lock(&mu_);
  ++Series(model, version).unloads_by_cause[cause];
}

void Metrics::SetResidency(std::shared_ptr<const ResidencyReport> report) {
  MutexLock lock(&mu_);
  residency_ = std::move(report);
}

void Metrics::RecordRunnerCrash(const std::string& model, int64_t version) {
  MutexLock lock(&mu_);
  ++Series(model, version).runner_crashes;
}

void Metrics::RecordGenerate(const std::string& model, int64_t version, const std::string& finish_reason,
                             int64_t prompt_tokens, int64_t completion_tokens, double first_token_s) {
  MutexLock lock(&mu_);
  ModelSeries& s = Series(model, version);
  ++s.generate_by_finish[finish_reason];
  s.prompt_tokens += static_cast<uint64_t>(prompt_tokens);
  s.completion_tokens += static_cast<uint64_t>(completion_tokens);
  if (completion_tokens > 0) s.first_token.Observe(first_token_s);
}

std::string Metrics::Render() const {
  std::string out;
  MutexLock lock(&mu_);
  auto labels = [](const std::pair<std::string, int64_t>& key) {
    return "model=\"" + MetricLabelValue(key.first) + "\",version=\"" + std::to_string(key.second) + "\"";
  };
  AppendMetricHeader(&out, "aotid_inference_requests_total", "counter",
                     "Infer requests by model, version and HTTP status.");
  for (const auto& [key, s] : models_) {
    for (const auto& [status, n] : s.requests_by_status) {
      out += "aotid_inference_requests_total{" + labels(key) + ",code=\"" + std::to_string(status) + "\"} " +
             std::to_string(n) + "\n";
    }
  }
  // The per-model histograms: name, help, which one.
  static const struct {
    const char* name;
    const char* help;
    Histogram ModelSeries::*histogram;
  } kHistograms[] = {
      {"aotid_inference_duration_seconds",
       "Infer request time in the server, from routing to the encoded reply.", &ModelSeries::total},
      {"aotid_compute_duration_seconds", "Time the model itself ran, per infer request.",
       &ModelSeries::compute},
      {"aotid_queue_duration_seconds",
       "Time a request waited in its model's batching queue (batched models only).", &ModelSeries::queue},
      {"aotid_batch_rows", "Rows per batched model run (batched models only).", &ModelSeries::batch_rows},
  };
  for (const auto& h : kHistograms) {
    AppendMetricHeader(&out, h.name, "histogram", h.help);
    for (const auto& [key, s] : models_) (s.*h.histogram).Write(&out, h.name, labels(key));
  }
  AppendMetricHeader(
      &out, "aotid_runner_crashes_total", "counter",
      "Runner processes that crashed or were stopped past their deadline, by model and version.");
  for (const auto& [key, s] : models_) {
    if (s.runner_crashes)
      out += "aotid_runner_crashes_total{" + labels(key) + "} " + std::to_string(s.runner_crashes) + "\n";
  }
  AppendMetricHeader(&out, "aotid_generate_requests_total", "counter",
                     "Generate requests, by model, version and how they ended (stop, length, cancelled, "
                     "error, busy: refused while the most requests waited for the model).");
  for (const auto& [key, s] : models_) {
    for (const auto& [reason, n] : s.generate_by_finish) {
      out += "aotid_generate_requests_total{" + labels(key) + ",finish_reason=\"" + reason + "\"} " +
             std::to_string(n) + "\n";
    }
  }
  AppendMetricHeader(&out, "aotid_generate_tokens_total", "counter",
                     "Tokens of generate requests, by model, version and kind (prompt, completion).");
  for (const auto& [key, s] : models_) {
    if (s.generate_by_finish.empty()) continue;
    out += "aotid_generate_tokens_total{" + labels(key) + ",kind=\"prompt\"} " +
           std::to_string(s.prompt_tokens) + "\n";
    out += "aotid_generate_tokens_total{" + labels(key) + ",kind=\"completion\"} " +
           std::to_string(s.completion_tokens) + "\n";
  }
  AppendMetricHeader(&out, "aotid_generate_first_token_seconds", "histogram",
                     "From the start of a generate request's prompt to its first token.");
  for (const auto& [key, s] : models_) {
    if (!s.generate_by_finish.empty())
      s.first_token.Write(&out, "aotid_generate_first_token_seconds", labels(key));
  }
  AppendMetricHeader(
      &out, "aotid_model_loads_total", "counter",
      "Runners loaded on demand (a request came for a version that was not resident), by model "
      "and version.");
  for (const auto& [key, s] : models_) {
    if (s.resident_loads)
      out += "aotid_model_loads_total{" + labels(key) + "} " + std::to_string(s.resident_loads) + "\n";
  }
  AppendMetricHeader(&out, "aotid_model_load_wait_seconds", "histogram",
                     "From a request asking for a version that was not resident to its runner being up "
                     "(waiting for memory and loading).");
  for (const auto& [key, s] : models_) {
    if (s.resident_loads) s.load_wait.Write(&out, "aotid_model_load_wait_seconds", labels(key));
  }
  AppendMetricHeader(&out, "aotid_model_unloads_total", "counter",
                     "Runners unloaded, by model, version and cause (idle: keep_alive; evicted: to make room "
                     "for another; budget: runners grew past the budget; pressure: the kernel's memory "
                     "pressure; memory_kill: its runner was killed for memory).");
  for (const auto& [key, s] : models_) {
    for (const auto& [cause, n] : s.unloads_by_cause)
      out += "aotid_model_unloads_total{" + labels(key) + ",cause=\"" + cause + "\"} " + std::to_string(n) +
             "\n";
  }
  if (residency_) {
    AppendMetricHeader(&out, "aotid_model_resident_bytes", "gauge",
                       "Memory of a version's runner, as measured now (PSS on Linux), while it is resident.");
    for (const auto& v : residency_->versions) {
      if (v.bytes == 0) continue;
      out += "aotid_model_resident_bytes{model=\"" + MetricLabelValue(v.name) + "\",version=\"" +
             std::to_string(v.version) + "\"} " + std::to_string(v.bytes) + "\n";
    }
    AppendMetricHeader(&out, "aotid_memory_budget_bytes", "gauge",
                       "The runners' memory budget (residency.memory_budget_mb); 0: none.");
    out += "aotid_memory_budget_bytes " + std::to_string(residency_->budget_bytes) + "\n";
    AppendMetricHeader(&out, "aotid_memory_budget_used_bytes", "gauge",
                       "What resident and loading versions count for against the budget.");
    out += "aotid_memory_budget_used_bytes " + std::to_string(residency_->used_bytes) + "\n";
  }
  AppendMetricHeader(&out, "aotid_inflight_requests", "gauge", "Infer requests being handled now.");
  out += "aotid_inflight_requests " + std::to_string(in_flight_.load()) + "\n";
  AppendMetricHeader(
      &out, "aotid_models_loaded", "gauge",
      "Model versions ready to serve, resident or not (aotid_model_resident_bytes: those resident).");
  out += "aotid_models_loaded " + std::to_string(models_loaded_.load()) + "\n";
  AppendMetricHeader(&out, "aotid_builds_total", "counter",
                     "Builds that ended, by outcome, since the daemon started.");
  out += "aotid_builds_total{outcome=\"ready\"} " + std::to_string(builds_ok_) + "\n";
  out += "aotid_builds_total{outcome=\"failed\"} " + std::to_string(builds_failed_) + "\n";
  AppendMetricHeader(&out, "aotid_build_duration_seconds", "histogram", "How long builds took.");
  build_duration_.Write(&out, "aotid_build_duration_seconds", "");
  if (int64_t rss = ResidentMemoryBytes(); rss >= 0) {
    AppendMetricHeader(&out, "aotid_process_resident_memory_bytes", "gauge",
                       "Resident set size of the daemon.");
    out += "aotid_process_resident_memory_bytes " + std::to_string(rss) + "\n";
  }
  if (collect_) collect_(&out);
  return out;
}

int64_t ResidentMemoryBytes() {
#ifdef __linux__
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return -1;
  long long pages_total = 0, pages_resident = 0;
  int n = std::fscanf(f, "%lld %lld", &pages_total, &pages_resident);
  std::fclose(f);
  if (n != 2) return -1;
  return pages_resident * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
#elif defined(__APPLE__)
  mach_task_basic_info_data_t info{};
  mach_msg_type_number_t count = MACH_TASK_BASIC_INFO_COUNT;
  if (::task_info(::mach_task_self(), MACH_TASK_BASIC_INFO, reinterpret_cast<task_info_t>(&info), &count) !=
      KERN_SUCCESS)
    return -1;
  return static_cast<int64_t>(info.resident_size);
#else
  return -1;
#endif
}

}  // namespace aotid::serving
