// The SDK header compiles as C (c_layout.c, -std=c11 -pedantic -Werror) with the v1 layout pinned by
// _Static_assert there; this test checks that C and C++ agree on it at run time.
#include <gtest/gtest.h>

#include <grove/grove_plugin.h>
#include <grove/plugin.hpp>

extern "C" double grove_c_config_probe(void);
extern "C" size_t grove_c_sizeof_descriptor(void);

TEST(SdkLayout, CAndCppAgreeOnDescriptorSize) {
    EXPECT_EQ(grove_c_sizeof_descriptor(), sizeof(grove_plugin_descriptor));
    EXPECT_EQ(sizeof(grove_plugin_descriptor), 128u);  // ABI 1.2 appended `environment`, 1.5 `objective`
}

TEST(SdkLayout, CConfigHelpersFindExactKeysAndFallBack) { EXPECT_DOUBLE_EQ(grove_c_config_probe(), 2.5 + 16 + 7); }

TEST(SdkLayout, HasFieldReadsAppendedFieldsOnlyWhenPresent) {
    grove_reduction_context old_context{};
    old_context.struct_size = offsetof(grove_reduction_context, optimizer_window_tokens);  // a v1.0 caller without the field
    EXPECT_FALSE(GROVE_HAS_FIELD(&old_context, grove_reduction_context, optimizer_window_tokens));
    old_context.struct_size = sizeof(grove_reduction_context);
    EXPECT_TRUE(GROVE_HAS_FIELD(&old_context, grove_reduction_context, optimizer_window_tokens));
}

TEST(SdkLayout, CppGuardTurnsExceptionsIntoStatusAndMessage) {
    std::string message, key;
    struct Sink {
        grove_error_sink sink;
        std::string* message;
        std::string* key;
    } s{{sizeof(grove_error_sink), nullptr,
         [](grove_error_sink* sink, const char* k, const char* m) {
             auto* self = reinterpret_cast<Sink*>(sink);
             *self->message = m;
             *self->key = k ? k : "";
         }},
        &message,
        &key};
    EXPECT_EQ(grove::sdk::guard(&s.sink, [] { throw std::runtime_error("boom"); }), GROVE_ERROR_INTERNAL);
    EXPECT_NE(message.find("boom"), std::string::npos);
    EXPECT_EQ(grove::sdk::guard(&s.sink, [] { throw grove::sdk::config_error("r", "must be > 0"); }), GROVE_ERROR_CONFIG);
    EXPECT_EQ(key, "r");
    EXPECT_EQ(message, "must be > 0");
    EXPECT_EQ(grove::sdk::guard(&s.sink, [] {}), GROVE_OK);
}
