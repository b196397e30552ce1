#include "serving/metrics.h"

#include "test_util.h"

namespace aotid::serving {
namespace {

bool Has(const std::string& text, const std::string& line) { return text.find(line) != std::string::npos; }

TEST(Metrics, InferRequestsAreCountedByModelVersionAndStatus) {
  Metrics m;
  m.RecordInfer("mlp", 2, 200, 0.002, 0.001);
  m.RecordInfer("mlp", 2, 200, 0.004, 0.003);
  m.RecordInfer("mlp", 2, 400, 0.001, 0);
  m.RecordInfer("conv", 1, 499, 0.001, 0);
  std::string text = m.Render();
  EXPECT_TRUE(Has(text, "aotid_inference_requests_total{model=\"mlp\",version=\"2\",code=\"200\"} 2\n"))
      << text;
  EXPECT_TRUE(Has(text, "aotid_inference_requests_total{model=\"mlp\",version=\"2\",code=\"400\"} 1\n"));
  EXPECT_TRUE(Has(text, "aotid_inference_requests_total{model=\"conv\",version=\"1\",code=\"499\"} 1\n"));
  EXPECT_TRUE(Has(text, "aotid_inference_duration_seconds_count{model=\"mlp\",version=\"2\"} 3\n"));
  EXPECT_TRUE(
      Has(text, "aotid_inference_duration_seconds_bucket{model=\"mlp\",version=\"2\",le=\"+Inf\"} 3\n"));
  EXPECT_TRUE(Has(text, "# TYPE aotid_inference_duration_seconds histogram\n"));
}

TEST(Metrics, HistogramBucketsAreCumulative) {
  Histogram h({0.1, 1});
  h.Observe(0.05);
  h.Observe(0.5);
  h.Observe(5);
  std::string out;
  h.Write(&out, "x", "");
  EXPECT_TRUE(Has(out, "x_bucket{le=\"0.1\"} 1\n")) << out;
  EXPECT_TRUE(Has(out, "x_bucket{le=\"1\"} 2\n")) << out;
  EXPECT_TRUE(Has(out, "x_bucket{le=\"+Inf\"} 3\n")) << out;
  EXPECT_TRUE(Has(out, "x_count 3\n")) << out;
  EXPECT_TRUE(Has(out, "x_sum 5.55")) << out;
}

TEST(Metrics, BuildsBatchesAndGaugesAreRendered) {
  Metrics m;
  m.RecordBuild(true, 12.5);
  m.RecordBuild(false, 1);
  m.RecordBatch("conv", 1, 6, {0.001, 0.002});
  m.SetModelsLoaded(3);
  {
    Metrics::InFlight one(&m);
    EXPECT_TRUE(Has(m.Render(), "aotid_inflight_requests 1\n"));
  }
  std::string text = m.Render();
  EXPECT_TRUE(Has(text, "aotid_inflight_requests 0\n"));
  EXPECT_TRUE(Has(text, "aotid_builds_total{outcome=\"ready\"} 1\n"));
  EXPECT_TRUE(Has(text, "aotid_builds_total{outcome=\"failed\"} 1\n"));
  EXPECT_TRUE(Has(text, "aotid_build_duration_seconds_count 2\n"));
  EXPECT_TRUE(Has(text, "aotid_models_loaded 3\n"));
  EXPECT_TRUE(Has(text, "aotid_batch_rows_count{model=\"conv\",version=\"1\"} 1\n")) << text;
  EXPECT_TRUE(Has(text, "aotid_queue_duration_seconds_count{model=\"conv\",version=\"1\"} 2\n"));
}

TEST(Metrics, LabelValuesAreEscaped) {
  Metrics m;
  m.RecordInfer("a\"b\\c", 1, 200, 0.001, 0.001);
  EXPECT_TRUE(Has(m.Render(), "model=\"a\\\"b\\\\c\"")) << m.Render();
  EXPECT_EQ(MetricLabelValue("/srv/a\nb"), "/srv/a\\nb");  // a folder's path as a [[sync]] source
}

TEST(Metrics, CollectorFamiliesAreAppendedUntilCleared) {
  Metrics m;
  int asked = 0;
  m.SetCollector([&asked](std::string* out) {
    ++asked;
    AppendMetricHeader(out, "aotid_sync_failures_in_a_row", "gauge", "Failed syncs.");
    *out += "aotid_sync_failures_in_a_row{source=\"x\"} 2\n";
  });
  std::string text = m.Render();
  EXPECT_TRUE(
      Has(text, "# TYPE aotid_sync_failures_in_a_row gauge\naotid_sync_failures_in_a_row{source=\"x\"} 2\n"))
      << text;
  EXPECT_EQ(asked, 1);
  m.SetCollector(nullptr);
  EXPECT_FALSE(Has(m.Render(), "aotid_sync_failures_in_a_row"));
  EXPECT_EQ(asked, 1);
}

}  // namespace
}  // namespace aotid::serving

namespace aotid::serving {
namespace {

TEST(Metrics, LoadsOnDemandAndUnloadsAreCountedByCause) {
  Metrics m;
  m.RecordResidentLoad("a", 1, 0.3);
  m.RecordResidentLoad("a", 1, 12.0);
  m.RecordUnload("a", 1, "idle");
  m.RecordUnload("a", 1, "evicted");
  m.RecordUnload("a", 1, "evicted");
  std::string text = m.Render();
  EXPECT_NE(text.find("aotid_model_loads_total{model=\"a\",version=\"1\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("aotid_model_unloads_total{model=\"a\",version=\"1\",cause=\"evicted\"} 2\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("aotid_model_unloads_total{model=\"a\",version=\"1\",cause=\"idle\"} 1\n"),
            std::string::npos);
  // The wait of each: one within half a second, one past ten.
  EXPECT_NE(text.find("aotid_model_load_wait_seconds_bucket{model=\"a\",version=\"1\",le=\"0.5\"} 1\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("aotid_model_load_wait_seconds_count{model=\"a\",version=\"1\"} 2\n"),
            std::string::npos);
}

}  // namespace
}  // namespace aotid::serving
