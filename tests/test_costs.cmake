# What the slow tests cost, in seconds of one serial CI run on the 2-core
# CI machine, so that `ctest -j` (./dev test runs two at a time) starts them
# first and fills the gaps with the quick ones; without this a clean clone,
# which has no Testing/Temporary/CTestCostData.txt yet, starts them in the
# order they were added and ends on a long test running alone. ctest
# replaces these with its own measurements once a build folder has run
# them. Included at the end of tests/CMakeLists.txt (cmake_language(DEFER)),
# after every test exists; a test this configuration leaves out (Linux only,
# fuzz, ...) is skipped. A new test that takes over ~20 s: add its line.
set(_aotid_test_costs
  llm.SmolLM2GreedyEqualsEager 730
  exporter.HfZooServedEqualToEager 510
  e2e.Packages 504
  install.WheelRunsFromAFreshVenvWithoutTheCheckout 95
  image.BuiltPushedPulledAndServes 220
  e2e.DaemonOverHttp 366
  e2e.Slots 250
  sync.PushSyncServeResumeAndRefuse 191
  fixture.DeployVenv 190
  deploy.DaemonSetCommandsServe 60
  deploy.RuntimeCommandsServe 60
  llm.MiniLmServedEqualsSentenceTransformers 140
  exporter.EmbeddingPackageEqualsSentenceTransformers 127
  llm.Int8WeightsGenerateEagerGreedyChoices 136
  fuzz.Build 247
  e2e.Generate 124
  e2e.Residency 100
  e2e.SharedCache 60
  e2e.GrpcHostile 50
  llm.OpenAiClientChatAndCompletions 95
  fuzz.HttpMutationLiveDaemon 72
  fuzz.GrpcMutationLiveDaemon 130
  interop.TritonClientAndCurl 70
  interop.GrpcClients 120
  exporter.NamedDynamicDimsServedAndBounded 64
  docs.ExamplesRunAsWritten 60
  exporter.LlmSlotsCompiledEqualsEager 40
  fuzz.DecodeInferRequest 61
  install.ExporterInstallsAloneAndExports 57
  fixture.ExportTestModels 117
  fuzz.Text 47
  fuzz.HttpRequest 46
  fuzz.GrpcInfer 46
  fuzz.Json 31
  exporter.DictExamplesAndNamedOutputs 23
  exporter.SelfCheckRefusesWhatTheWorkerCannotLoad 21)
while(_aotid_test_costs)
  list(POP_FRONT _aotid_test_costs _name _cost)
  if(TEST "${_name}")
    set_tests_properties("${_name}" PROPERTIES COST ${_cost})
  endif()
endwhile()
