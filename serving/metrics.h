// Prometheus metrics for GET /metrics (text exposition format 0.0.4).
//
// Thread-safe: HTTP threads record requests, the loop thread records builds.
// Series are created on first use, keyed by their labels; model names are
// validated, so the label values stay few and tame.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "serving/residency_report.h"

namespace aotid::serving {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1) {}
  void Observe(double v);
  // Appends NAME_bucket/_sum/_count lines with `labels` ("k=\"v\"" pairs, may be empty).
  void Write(std::string* out, const std::string& name, const std::string& labels) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();

  // One finished infer request: its HTTP status, the whole handling time,
  // and the model's own run time (0 when the model did not run).
  void RecordInfer(const std::string& model, int64_t version, int status, double total_s, double compute_s)
      EXCLUDES(mu_);
  // One batched run: its rows, and how long each request waited in the queue.
  void RecordBatch(const std::string& model, int64_t version, int rows, const std::vector<double>& queue_s)
      EXCLUDES(mu_);
  // A build that ended.
  void RecordBuild(bool ok, double duration_s) EXCLUDES(mu_);
  // A version's runner process that crashed (or was stopped past its deadline).
  void RecordRunnerCrash(const std::string& model, int64_t version) EXCLUDES(mu_);
  // One generate request that ran: how it ended ("stop", "length",
  // "cancelled", "error") and its tokens.
  void RecordGenerate(const std::string& model, int64_t version, const std::string& finish_reason,
                      int64_t prompt_tokens, int64_t completion_tokens, double first_token_s) EXCLUDES(mu_);
  void SetModelsLoaded(int n) { models_loaded_.store(n); }
  // Residency (control/residency.h): a version's runner loaded on demand,
  // after `wait_s` from its asking; one unloaded, and why ("idle",
  // "evicted", "budget", "pressure", "memory_kill").
  void RecordResidentLoad(const std::string& model, int64_t version, double wait_s) EXCLUDES(mu_);
  void RecordUnload(const std::string& model, int64_t version, const std::string& cause) EXCLUDES(mu_);
  // What is resident now: each version's measured bytes and the budget.
  void SetResidency(std::shared_ptr<const ResidencyReport> report) EXCLUDES(mu_);

  // RAII: counts a request as in flight for its lifetime.
  class InFlight {
   public:
    explicit InFlight(Metrics* m) : m_(m) { m_->in_flight_.fetch_add(1); }
    ~InFlight() { Done(); }
    // The request has ended: counted out now, before its answer is written
    // (a client that reads the answer and then scrapes must not count it),
    // rather than when the last copy of its callback goes. Once.
    void Done() {
      if (!done_.exchange(true)) m_->in_flight_.fetch_sub(1);
    }

   private:
    Metrics* m_;
    std::atomic<bool> done_{false};
  };

  // Metric families kept elsewhere (the daemon's syncer): `collect`
  // appends whole families (AppendMetricHeader, then samples) at each
  // Render. Set before serving starts, or to nullptr before what it reads goes.
  void SetCollector(std::function<void(std::string*)> collect) EXCLUDES(mu_);

  std::string Render() const EXCLUDES(mu_);

 private:
  struct ModelSeries {
    std::map<int, uint64_t> requests_by_status;
    Histogram total;
    Histogram compute;
    Histogram queue;
    Histogram batch_rows;
    uint64_t runner_crashes = 0;
    std::map<std::string, uint64_t> generate_by_finish;
    uint64_t prompt_tokens = 0, completion_tokens = 0;
    Histogram first_token;
    uint64_t resident_loads = 0;
    std::map<std::string, uint64_t> unloads_by_cause;
    Histogram load_wait;
  };
  ModelSeries& Series(const std::string& model, int64_t version) REQUIRES(mu_);
  mutable Mutex mu_;
  std::map<std::pair<std::string, int64_t>, ModelSeries> models_ GUARDED_BY(mu_);
  uint64_t builds_ok_ GUARDED_BY(mu_) = 0;
  uint64_t builds_failed_ GUARDED_BY(mu_) = 0;
  Histogram build_duration_ GUARDED_BY(mu_);
  std::function<void(std::string*)> collect_ GUARDED_BY(mu_);
  std::shared_ptr<const ResidencyReport> residency_ GUARDED_BY(mu_);
  std::atomic<int64_t> in_flight_{0};
  std::atomic<int> models_loaded_{0};
};

// "# HELP" and "# TYPE" lines of a metric family.
void AppendMetricHeader(std::string* out, const std::string& name, const std::string& type,
                        const std::string& help);
// A label value escaped for the text format (\\, \", \n).
std::string MetricLabelValue(const std::string& v);

// This process's resident set size in bytes (Linux: /proc/self/statm;
// macOS: the task's basic info), or -1 where unknown.
int64_t ResidentMemoryBytes();

}  // namespace aotid::serving
