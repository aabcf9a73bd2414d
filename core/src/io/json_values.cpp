#include "io/json_values.hpp"

#include "grove/error.hpp"

namespace grove {

namespace {
std::string shown(const nlohmann::json& value) {
    std::string text = value.dump();
    return text.size() > 40 ? text.substr(0, 40) + "..." : text;
}
}  // namespace

int64_t json_integer(const nlohmann::json& value, const std::string& where, int64_t min, int64_t max) {
    std::string problem;
    if (value.is_number_unsigned()) {
        const uint64_t u = value.get<uint64_t>();
        if (u <= uint64_t(max) && int64_t(u) >= min) return int64_t(u);
        problem = "is out of range";
    } else if (value.is_number_integer()) {
        const int64_t i = value.get<int64_t>();
        if (i >= min && i <= max) return i;
        problem = "is out of range";
    } else {
        problem = "is not an integer";
    }
    throw Error(ErrorKind::input, where + ": " + shown(value) + " " + problem + " (expected an integer in [" +
                                      std::to_string(min) + ", " + std::to_string(max) + "])");
}

std::vector<int64_t> json_integers(const nlohmann::json& value, const std::string& where, int64_t min, int64_t max) {
    if (!value.is_array()) throw Error(ErrorKind::input, where + ": " + shown(value) + " is not a list of integers");
    std::vector<int64_t> out;
    out.reserve(value.size());
    for (size_t i = 0; i < value.size(); ++i)
        out.push_back(json_integer(value[i], where + "[" + std::to_string(i) + "]", min, max));
    return out;
}

double json_number(const nlohmann::json& value, const std::string& where) {
    if (!value.is_number()) throw Error(ErrorKind::input, where + ": " + shown(value) + " is not a number");
    return value.get<double>();
}

}  // namespace grove
