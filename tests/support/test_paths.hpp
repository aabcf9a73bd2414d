// The build's paths, for the tests. They are functions rather than -D definitions so that a test's
// object file is the same in every clone of the repository and ccache reuses it (CI builds a fresh
// clone each time); the values live in test_paths.cpp alone. Every source that links
// grove_test_support includes this header (-include), so the names read as the definitions they replace.
#pragma once

namespace grove::test_paths {
const char* source_dir();          // the repository
const char* tests_binary_dir();    // <build>/tests
const char* plugin_dir();          // the build's plugin folder (lib/grove/plugins)
const char* grove_executable();    // <build>/bin/grove
const char* python();              // the virtual environment's interpreter
const char* test_plugin_dir();     // <build>/tests/core/test-plugins
const char* fake_plugin_worker();  // <build>/bin/fake_plugin_worker
// a test plugin under test_plugin_dir(), by its file's path below it
const char* test_plugin(const char* relative);
}  // namespace grove::test_paths

#define GROVE_TEST_SOURCE_DIR (::grove::test_paths::source_dir())
#define GROVE_TEST_BINARY_DIR (::grove::test_paths::tests_binary_dir())
#define GROVE_TEST_PLUGIN_DIR (::grove::test_paths::plugin_dir())
#define GROVE_EXECUTABLE (::grove::test_paths::grove_executable())
#define GROVE_PYTHON (::grove::test_paths::python())
#define GROVE_TEST_PLUGIN_FIXTURES (::grove::test_paths::test_plugin_dir())
#define GROVE_TEST_FAKE_WORKER (::grove::test_paths::fake_plugin_worker())
#define GROVE_TEST_LOW_IDS_PLUGIN (::grove::test_paths::test_plugin("liblow_ids.so"))
#define GROVE_TEST_RANK_ONE_PLUGIN (::grove::test_paths::test_plugin("librank_one.so"))
#define GROVE_TEST_SCRIPTED_ENV_PLUGIN (::grove::test_paths::test_plugin("libscripted_env.so"))
#define GROVE_TEST_MODEL_TOKENS_PLUGIN (::grove::test_paths::test_plugin("libmodel_tokens.so"))
#define GROVE_TEST_NAN_OBJECTIVE_PLUGIN (::grove::test_paths::test_plugin("nan_objective/libnan_objective.so"))
#define GROVE_TEST_MISBEHAVING_PLUGIN (::grove::test_paths::test_plugin("misbehaving/libmisbehaving.so"))
