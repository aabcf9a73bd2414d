// Checked reads of numbers from JSON files Grove did not write (tokenizer.json, config.json,
// rollouts, trainer_state.json). nlohmann's get<int64_t>() converts a float such as 1e300 with
// undefined behaviour and a string with a message naming no file; these name the file and field.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace grove {

// `where` names the file and field, e.g. "tokenizer.json: added_tokens[3].id".
// An integer in [min, max]; anything else (a float, a string, out of range) is grove::Error(input).
int64_t json_integer(const nlohmann::json& value, const std::string& where, int64_t min = INT64_MIN, int64_t max = INT64_MAX);
std::vector<int64_t> json_integers(const nlohmann::json& value, const std::string& where, int64_t min = INT64_MIN,
                                   int64_t max = INT64_MAX);
// A finite or infinite number (integer or float); NaN from null only where the caller allows it.
double json_number(const nlohmann::json& value, const std::string& where);

}  // namespace grove
