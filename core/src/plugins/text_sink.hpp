// A grove_text_sink that appends what a plugin writes to a host string.
#pragma once

#include <grove/grove_plugin.h>

#include <string>

namespace grove {

// Appends go to `text`, which must outlive the sink.
inline grove_text_sink text_sink_into(std::string& text) {
    return {sizeof(grove_text_sink), &text, [](grove_text_sink* s, const char* data, size_t size) {
                static_cast<std::string*>(s->host_data)->append(data, size);
            }};
}

}  // namespace grove
