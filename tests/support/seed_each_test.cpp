// Every test starts from the same random state. ATen's default generator is seeded differently in
// each process, so a test that draws its inputs without seeding would see new ones in every run, and
// a tolerance that most draws meet would fail now and then (as one did in CI). Linked into every
// test program that links grove_torch (tests/CMakeLists.txt).
#include <ATen/Context.h>
#include <gtest/gtest.h>

namespace {

class SeedEachTest : public ::testing::EmptyTestEventListener {
    void OnTestStart(const ::testing::TestInfo&) override { at::manual_seed(0); }
};

const bool kRegistered = [] {
    ::testing::UnitTest::GetInstance()->listeners().Append(new SeedEachTest);
    return true;
}();

}  // namespace
