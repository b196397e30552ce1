#include "platform/device_probe.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "base/fs.h"
#include "test_util.h"

namespace aotid::platform {
namespace {

using ::aotid::testing::TempDir;

// What the worker's probe prints on a machine with one usable GPU.
const char kGpuOutput[] =
    "some warning torch printed first\n"
    "aotid-devices: {\"torch\": \"2.13.0\", \"mps\": {\"usable\": false, \"reason\": \"this machine is "
    "not a Mac\"}, \"cuda\": {\"usable\": true, \"name\": \"NVIDIA L4\", \"capability\": \"8.9\", "
    "\"count\": 1, \"note\": \"CUDA 12.8\"}}\n";

class DeviceProbeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::unsetenv("AOTID_CPU_ONLY");
    hw_.os = "linux";
    hw_.arch = "x86_64";
    hw_.vector_isa = "avx2";
    hw_.torch_version = "2.13.0";
    hw_.compiler = "c++ (test) 12";
  }

  // Options whose probe is a fake answering `output`, counting its runs.
  DeviceProbeOptions Fake(std::string output) {
    DeviceProbeOptions o;
    o.python = "/venv/bin/python";
    o.worker_dir = dir_.path();
    o.cache_file = dir_ / "devices.json";
    o.run = [this, output](const DeviceProbeOptions&) -> StatusOr<std::string> {
      ++runs_;
      return output;
    };
    return o;
  }

  // A stand-in for Python: a shell script with `body`.
  std::string Script(const std::string& name, const std::string& body) {
    std::string path = dir_ / name;
    EXPECT_OK(fs::WriteFileAtomic(path, "#!/bin/sh\n" + body + "\n"));
    ::chmod(path.c_str(), 0755);
    return path;
  }

  TempDir dir_;
  HardwareInfo hw_;
  int runs_ = 0;
};

TEST_F(DeviceProbeTest, AnswerDecidesAutoAndWhatIsAvailable) {
  DeviceProbeReport report = ProbeDevices(Fake(kGpuOutput), &hw_);
  ASSERT_OK(report.status);
  EXPECT_EQ(AutoDevice(hw_), "cuda");
  EXPECT_OK(DeviceAvailable(hw_, "cuda"));
  Status mps = DeviceAvailable(hw_, "mps");
  EXPECT_NE(mps.message().find("this machine is not a Mac"), std::string::npos) << mps.ToString();
  ASSERT_EQ(hw_.accelerators.size(), 2u);
  EXPECT_EQ(hw_.accelerators[0], "mps: not available: this machine is not a Mac");
  EXPECT_EQ(hw_.accelerators[1], "cuda: NVIDIA L4 (compute capability 8.9, CUDA 12.8)");
}

TEST_F(DeviceProbeTest, KeptAnswerIsUsedWithoutRunningTheProbeAgain) {
  ASSERT_OK(ProbeDevices(Fake(kGpuOutput), &hw_).status);
  ASSERT_EQ(runs_, 1);
  HardwareInfo again = hw_;
  again.accelerators.clear();
  again.cuda_missing = again.mps_missing = "not probed";
  DeviceProbeReport report = ProbeDevices(Fake("no answer here"), &again);
  EXPECT_EQ(runs_, 1);  // the kept answer, not the (broken) probe
  EXPECT_TRUE(report.from_cache);
  EXPECT_FALSE(report.ran);
  EXPECT_OK(report.status);
  EXPECT_EQ(AutoDevice(again), "cuda");
  EXPECT_EQ(again.accelerators, hw_.accelerators);
}

TEST_F(DeviceProbeTest, RefreshAsksAgainAndReplacesTheKeptAnswer) {
  ASSERT_OK(ProbeDevices(Fake(kGpuOutput), &hw_).status);
  DeviceProbeOptions o = Fake(
      "aotid-devices: {\"torch\": \"2.13.0\", \"mps\": {\"usable\": false, \"reason\": \"not a Mac\"}, "
      "\"cuda\": {\"usable\": false, \"reason\": \"Found no NVIDIA driver on your system.\"}}\n");
  o.refresh = true;
  DeviceProbeReport report = ProbeDevices(o, &hw_);
  EXPECT_EQ(runs_, 2);
  EXPECT_TRUE(report.ran);
  EXPECT_EQ(AutoDevice(hw_), "cpu");
  auto kept = ReadKeptDevices(o.cache_file, DeviceProbeKey(hw_, o.python));
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_FALSE(kept->cuda.usable);
}

TEST_F(DeviceProbeTest, KeptAnswerOfAnotherFingerprintIsAskedAgain) {
  ASSERT_OK(ProbeDevices(Fake(kGpuOutput), &hw_).status);
  std::string old_key = DeviceProbeKey(hw_, "/venv/bin/python");
  hw_.torch_version = "2.13.0+cpu";  // another torch: another fingerprint
  ASSERT_NE(DeviceProbeKey(hw_, "/venv/bin/python"), old_key);
  Status stale = ReadKeptDevices(dir_ / "devices.json", DeviceProbeKey(hw_, "/venv/bin/python")).status();
  EXPECT_EQ(stale.code(), StatusCode::kFailedPrecondition) << stale.ToString();

  DeviceProbeReport report = ProbeDevices(
      Fake("aotid-devices: {\"torch\": \"2.13.0+cpu\", \"mps\": {\"usable\": false, \"reason\": \"not a "
           "Mac\"}, "
           "\"cuda\": {\"usable\": false, \"reason\": \"this torch (2.13.0+cpu) is a CPU build\"}}\n"),
      &hw_);
  EXPECT_EQ(runs_, 2);
  EXPECT_FALSE(report.from_cache);
  EXPECT_NE(report.note.find("another machine"), std::string::npos) << report.note;
  EXPECT_EQ(AutoDevice(hw_), "cpu");
  EXPECT_NE(hw_.cuda_missing.find("CPU build"), std::string::npos) << hw_.cuda_missing;
  // Kept again, under the new key.
  EXPECT_TRUE(ReadKeptDevices(dir_ / "devices.json", DeviceProbeKey(hw_, "/venv/bin/python")).ok());
}

TEST_F(DeviceProbeTest, KeptAnswerOfAnotherPythonIsAskedAgain) {
  ASSERT_OK(ProbeDevices(Fake(kGpuOutput), &hw_).status);
  DeviceProbeOptions o = Fake(kGpuOutput);
  o.python = "/other/venv/bin/python";
  ProbeDevices(o, &hw_);
  EXPECT_EQ(runs_, 2);
}

TEST_F(DeviceProbeTest, GarbageKeptAnswerIsRefusedWithItsReasonAndReplaced) {
  ASSERT_OK(fs::WriteFileAtomic(dir_ / "devices.json", "{\"key\": \"x\", \"answer\": [1, 2"));
  Status garbage = ReadKeptDevices(dir_ / "devices.json", DeviceProbeKey(hw_, "/venv/bin/python")).status();
  EXPECT_EQ(garbage.code(), StatusCode::kCorruption) << garbage.ToString();

  DeviceProbeReport report = ProbeDevices(Fake(kGpuOutput), &hw_);
  EXPECT_EQ(runs_, 1);
  EXPECT_OK(report.status);
  EXPECT_NE(report.note.find("the kept answer was refused: " + garbage.message()), std::string::npos)
      << report.note;
  EXPECT_EQ(AutoDevice(hw_), "cuda");
  EXPECT_TRUE(ReadKeptDevices(dir_ / "devices.json", DeviceProbeKey(hw_, "/venv/bin/python")).ok());
}

TEST_F(DeviceProbeTest, KeptAnswerOfTheWrongShapeIsRefused) {
  std::string key = DeviceProbeKey(hw_, "/venv/bin/python");
  nlohmann::json kept = {{"key", key},
                         {"answer", {{"mps", {{"usable", "yes"}}}, {"cuda", {{"usable", true}}}}}};
  ASSERT_OK(fs::WriteFileAtomic(dir_ / "devices.json", kept.dump()));
  Status s = ReadKeptDevices(dir_ / "devices.json", key).status();
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_NE(s.message().find("'mps' has no 'usable' true or false"), std::string::npos) << s.ToString();
  // A device that is not usable must say why.
  kept["answer"] = {{"mps", {{"usable", false}}}, {"cuda", {{"usable", true}}}};
  ASSERT_OK(fs::WriteFileAtomic(dir_ / "devices.json", kept.dump()));
  s = ReadKeptDevices(dir_ / "devices.json", key).status();
  EXPECT_NE(s.message().find("gives no reason"), std::string::npos) << s.ToString();
}

// The kept file is read only when it is a plain file of at most 64 KiB: a
// FIFO there once held the start for ever, and a link to /dev/zero filled
// memory. Either is refused at once and the probe asked again.
TEST_F(DeviceProbeTest, AKeptFileThatIsNotAPlainFileIsRefusedAtOnce) {
  const std::string kept = dir_ / "devices.json";
  const std::string key = DeviceProbeKey(hw_, "/venv/bin/python");
  ASSERT_EQ(::mkfifo(kept.c_str(), 0600), 0);
  Status fifo = ReadKeptDevices(kept, key).status();
  EXPECT_EQ(fifo.code(), StatusCode::kCorruption);
  EXPECT_NE(fifo.message().find("is not a regular file"), std::string::npos) << fifo.ToString();
  ASSERT_EQ(::unlink(kept.c_str()), 0);
  ASSERT_EQ(::symlink("/dev/zero", kept.c_str()), 0);
  EXPECT_EQ(ReadKeptDevices(kept, key).status().code(), StatusCode::kCorruption);
  DeviceProbeReport report = ProbeDevices(Fake(kGpuOutput), &hw_);
  EXPECT_EQ(runs_, 1);
  EXPECT_NE(report.note.find("is not a regular file"), std::string::npos) << report.note;
}

// A kept answer that cannot be true of this machine is not believed: MPS
// off a Mac, CUDA with a CPU build of torch. (Believed, it sent every build
// to a device that is not there, at every start.)
TEST_F(DeviceProbeTest, AKeptAnswerThatLiesAboutThisMachineIsNotBelieved) {
  const std::string key = DeviceProbeKey(hw_, "/venv/bin/python");
  const nlohmann::json lies[] = {
      {{"torch", "2.13.0"}, {"mps", {{"usable", true}}}, {"cuda", {{"usable", false}, {"reason", "none"}}}},
      {{"torch", "2.13.0+cpu"},
       {"mps", {{"usable", false}, {"reason", "not a Mac"}}},
       {"cuda", {{"usable", true}}}},
  };
  const char* why[] = {"says MPS is usable on a machine that is not a Mac",
                       "says CUDA is usable with a CPU build of torch (2.13.0+cpu)"};
  for (int i = 0; i < 2; ++i) {
    ASSERT_OK(
        fs::WriteFileAtomic(dir_ / "devices.json", nlohmann::json{{"key", key}, {"answer", lies[i]}}.dump()));
    ASSERT_TRUE(ReadKeptDevices(dir_ / "devices.json", key).ok());  // well formed
    runs_ = 0;
    DeviceProbeReport report = ProbeDevices(Fake(kGpuOutput), &hw_);
    EXPECT_EQ(runs_, 1) << why[i];
    EXPECT_NE(report.note.find(why[i]), std::string::npos) << report.note;
  }
}

// What a broken interpreter prints reaches the log and doctor's terminal
// without its control sequences.
TEST_F(DeviceProbeTest, WhatTheProbePrintedIsShownWithoutControlBytes) {
  auto answer = ParseDeviceProbeOutput("\x1b]0;PWNED\x07\x1b[2Jhello\n");
  ASSERT_FALSE(answer.ok());
  EXPECT_EQ(answer.status().message().find('\x1b'), std::string::npos) << answer.status().message();
  EXPECT_NE(answer.status().message().find("hello"), std::string::npos) << answer.status().message();
}

TEST_F(DeviceProbeTest, OutputWithoutAnAnswerLeavesTheCpuWithTheReason) {
  DeviceProbeReport report = ProbeDevices(Fake("Illegal instruction\n"), &hw_);
  EXPECT_FALSE(report.status.ok());
  EXPECT_NE(report.status.message().find("printed no answer: Illegal instruction"), std::string::npos)
      << report.status.ToString();
  EXPECT_EQ(AutoDevice(hw_), "cpu");
  EXPECT_NE(DeviceAvailable(hw_, "cuda").message().find("printed no answer"), std::string::npos);
  EXPECT_FALSE(fs::Exists(dir_ / "devices.json"));  // nothing kept: the next start asks again

  report = ProbeDevices(Fake("aotid-devices: {\"torch\": \"2.13.0\", \"mps\": 3}\n"), &hw_);
  EXPECT_NE(report.status.message().find("it says nothing of mps"), std::string::npos)
      << report.status.ToString();
  EXPECT_EQ(AutoDevice(hw_), "cpu");
}

TEST_F(DeviceProbeTest, ProbeThatHangsIsStoppedAndLeavesTheCpu) {
  DeviceProbeOptions o;
  o.python = Script("hangs", "echo $$ > '" + (dir_ / "pid") + "'\nexec sleep 60");
  o.worker_dir = dir_.path();
  o.cache_file = dir_ / "devices.json";
  o.timeout_ms = 300;
  DeviceProbeReport report = ProbeDevices(o, &hw_);
  EXPECT_FALSE(report.status.ok());
  EXPECT_NE(report.status.message().find("did not answer within 0.3 s and was stopped"), std::string::npos)
      << report.status.ToString();
  EXPECT_EQ(AutoDevice(hw_), "cpu");
  EXPECT_NE(hw_.mps_missing.find("did not answer"), std::string::npos) << hw_.mps_missing;
  EXPECT_NE(hw_.cuda_missing.find("did not answer"), std::string::npos) << hw_.cuda_missing;
  EXPECT_FALSE(fs::Exists(o.cache_file));
  // The probe is gone (killed and reaped), not left running.
  auto pid = fs::ReadFile(dir_ / "pid");
  ASSERT_TRUE(pid.ok());
  EXPECT_EQ(::kill(std::stoi(*pid), 0), -1);
  EXPECT_EQ(errno, ESRCH);
}

TEST_F(DeviceProbeTest, ProbeThatFailsSaysWhy) {
  DeviceProbeOptions o;
  o.python = Script("no-torch",
                    "echo 'Traceback (most recent call last):' >&2\n"
                    "echo \"ModuleNotFoundError: No module named 'torch'\" >&2\nexit 1");
  o.worker_dir = dir_.path();
  DeviceProbeReport report = ProbeDevices(o, &hw_);
  EXPECT_NE(report.status.message().find("exited with status 1"), std::string::npos)
      << report.status.ToString();
  EXPECT_NE(report.status.message().find("No module named 'torch'"), std::string::npos)
      << report.status.ToString();
  EXPECT_EQ(AutoDevice(hw_), "cpu");

  o.python = dir_ / "not-there";
  report = ProbeDevices(o, &hw_);
  EXPECT_NE(report.status.message().find("cannot start " + o.python), std::string::npos)
      << report.status.ToString();
  EXPECT_EQ(AutoDevice(hw_), "cpu");
}

TEST_F(DeviceProbeTest, CpuOnlyOverridesAUsableDevice) {
  ::setenv("AOTID_CPU_ONLY", "the runner's GPU cannot allocate", 1);
  ProbeDevices(Fake(kGpuOutput), &hw_);
  ::unsetenv("AOTID_CPU_ONLY");
  EXPECT_EQ(AutoDevice(hw_), "cpu");
  Status cuda = DeviceAvailable(hw_, "cuda");
  EXPECT_NE(cuda.message().find("AOTID_CPU_ONLY is set: the runner's GPU cannot allocate"), std::string::npos)
      << cuda.ToString();
  // The other device keeps its own reason.
  EXPECT_NE(DeviceAvailable(hw_, "mps").message().find("not a Mac"), std::string::npos);
  EXPECT_EQ(hw_.accelerators.back(), "cpu only: AOTID_CPU_ONLY is set: the runner's GPU cannot allocate");
}

TEST_F(DeviceProbeTest, MpsIsPreferredWhereBothAreUsable) {
  ProbeDevices(
      Fake("aotid-devices: {\"torch\": \"2.13.0\", \"mps\": {\"usable\": true, \"name\": \"Apple M2\"}, "
           "\"cuda\": {\"usable\": true, \"name\": \"eGPU\"}}\n"),
      &hw_);
  EXPECT_EQ(AutoDevice(hw_), "mps");
  EXPECT_EQ(hw_.accelerators[0], "mps: Apple M2");
}

// The worker's own probe, with the torch builds use here (a CPU build, on
// Linux or on a Mac): CUDA is not available, and it says why.
TEST_F(DeviceProbeTest, TheWorkersProbeSaysThisTorchIsACpuBuild) {
  HardwareInfo hw = ProbeHardware();
  DeviceProbeOptions o;
  o.python = AOTID_PYTHON;
  o.worker_dir = std::string(AOTID_SOURCE_DIR) + "/python";
  o.cache_file = dir_ / "devices.json";
  o.timeout_ms = 120000;  // a cold import of torch on a busy machine
  DeviceProbeReport report = ProbeDevices(o, &hw);
  ASSERT_OK(report.status);
  EXPECT_TRUE(report.ran);
  EXPECT_NE(hw.cuda_missing.find(") is a CPU build"), std::string::npos) << hw.cuda_missing;
  EXPECT_EQ(DeviceAvailable(hw, "cuda").code(), StatusCode::kUnavailable);
#ifdef __linux__
  EXPECT_EQ(hw.mps_missing, "this machine is not a Mac");
  EXPECT_EQ(AutoDevice(hw), "cpu");
#endif
  // Kept: the next start reads it and runs no Python.
  HardwareInfo again = ProbeHardware();
  DeviceProbeReport second = ProbeDevices(o, &again);
  EXPECT_TRUE(second.from_cache);
  EXPECT_EQ(again.cuda_missing, hw.cuda_missing);
}

}  // namespace
}  // namespace aotid::platform
