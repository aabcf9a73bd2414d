/* Compiled as C11 with -Wall -Wextra -pedantic -Werror: proves the SDK header is plain C, and pins the
 * frozen ABI v1 layout (LP64). Changing any of these numbers breaks every plugin already built:
 * that needs a new ABI major. Appending a field at the end of a struct is a minor change, and the
 * sizeof pins below are then updated deliberately. */
#include <grove/grove_plugin.h>

#define PIN(type, field, offset) _Static_assert(offsetof(type, field) == (offset), #type "." #field " moved")
#define PIN_SIZE(type, size) _Static_assert(sizeof(type) == (size), "sizeof(" #type ") changed")

PIN(grove_error_sink, struct_size, 0);
PIN(grove_error_sink, host_data, 8);
PIN(grove_error_sink, report, 16);
PIN_SIZE(grove_error_sink, 24);

PIN(grove_config_key, struct_size, 0);
PIN(grove_config_key, name, 8);
PIN(grove_config_key, type, 16);
PIN(grove_config_key, required, 20);
PIN(grove_config_key, default_text, 24);
PIN(grove_config_key, help, 32);
PIN_SIZE(grove_config_key, 40);

PIN(grove_config_value, struct_size, 0);
PIN(grove_config_value, key, 8);
PIN(grove_config_value, type, 16);
PIN(grove_config_value, string_value, 24);
PIN(grove_config_value, int_value, 32);
PIN(grove_config_value, float_value, 40);
PIN(grove_config_value, bool_value, 48);
PIN(grove_config_value, array_length, 52);
PIN(grove_config_value, string_array, 56);
PIN(grove_config_value, int_array, 64);
PIN(grove_config_value, float_array, 72);
PIN_SIZE(grove_config_value, 80);

PIN(grove_config, struct_size, 0);
PIN(grove_config, count, 4);
PIN(grove_config, values, 8);
PIN(grove_config, raw_toml, 16);
PIN(grove_config, source_name, 24);
PIN(grove_config, base_dir, 32); /* ABI 1.7 */
PIN_SIZE(grove_config, 40);

PIN(grove_plugin_descriptor, struct_size, 0);
PIN(grove_plugin_descriptor, kind, 4);
PIN(grove_plugin_descriptor, name, 8);
PIN(grove_plugin_descriptor, version, 16);
PIN(grove_plugin_descriptor, description, 24);
PIN(grove_plugin_descriptor, flags, 32);
PIN(grove_plugin_descriptor, config_keys, 40);
PIN(grove_plugin_descriptor, config_key_count, 48);
PIN(grove_plugin_descriptor, metric_names, 56);
PIN(grove_plugin_descriptor, metric_count, 64);
PIN(grove_plugin_descriptor, create, 72);
PIN(grove_plugin_descriptor, destroy, 80);
PIN(grove_plugin_descriptor, reward, 88);
PIN(grove_plugin_descriptor, reduction, 96);
PIN(grove_plugin_descriptor, adapter, 104);
PIN(grove_plugin_descriptor, environment, 112); /* ABI 1.2, appended */
PIN(grove_plugin_descriptor, objective, 120);   /* ABI 1.5, appended */
PIN_SIZE(grove_plugin_descriptor, 128);

PIN(grove_plugin_list, struct_size, 0);
PIN(grove_plugin_list, abi_major, 4);
PIN(grove_plugin_list, abi_minor, 8);
PIN(grove_plugin_list, count, 12);
PIN(grove_plugin_list, plugins, 16);
PIN_SIZE(grove_plugin_list, 24);

PIN(grove_host_api, struct_size, 0);
PIN(grove_host_api, abi_major, 4);
PIN(grove_host_api, abi_minor, 8);
PIN(grove_host_api, host_version, 16);
PIN(grove_host_api, log, 24);
PIN_SIZE(grove_host_api, 32);

PIN(grove_text, data, 0);
PIN(grove_text, size, 8);
PIN_SIZE(grove_text, 16);

PIN(grove_reward_batch, struct_size, 0);
PIN(grove_reward_batch, count, 4);
PIN(grove_reward_batch, num_generations, 8);
PIN(grove_reward_batch, prompts, 16);
PIN(grove_reward_batch, completions, 24);
PIN(grove_reward_batch, completion_token_offsets, 32);
PIN(grove_reward_batch, completion_tokens, 40);
PIN(grove_reward_batch, truncated, 48);
PIN(grove_reward_batch, row_json, 56);
PIN(grove_reward_batch, step, 64);
PIN(grove_reward_batch, seed, 72);
PIN(grove_reward_batch, rank, 80);
PIN(grove_reward_batch, world_size, 84);
PIN(grove_reward_batch, global_row_offset, 88);
PIN(grove_reward_batch, model_token_mask, 96);
PIN(grove_reward_batch, prompt_json, 104); /* ABI 1.7 */
PIN(grove_reward_batch, max_steps, 112);
PIN(grove_reward_batch, episode_turn_offsets, 120); /* ABI 1.10 */
PIN(grove_reward_batch, episode_turns, 128);
PIN_SIZE(grove_reward_batch, 136);

PIN(grove_reward_output, struct_size, 0);
PIN(grove_reward_output, scores, 8);
PIN(grove_reward_output, metric_count, 16);
PIN(grove_reward_output, metrics, 24);
PIN(grove_reward_output, host_data, 32); /* ABI 1.7 */
PIN(grove_reward_output, log_metric, 40);
PIN(grove_reward_output, log_extra, 48); /* ABI 1.8 */
PIN_SIZE(grove_reward_output, 56);

PIN(grove_reward_api, struct_size, 0);
PIN(grove_reward_api, score, 8);
PIN_SIZE(grove_reward_api, 16);

PIN(grove_reduction_context, struct_size, 0);
PIN(grove_reduction_context, rows, 4);
PIN(grove_reduction_context, columns, 8);
PIN(grove_reduction_context, mask, 16);
PIN(grove_reduction_context, gradient_accumulation_steps, 24);
PIN(grove_reduction_context, steps_per_generation, 28);
PIN(grove_reduction_context, world_size, 32);
PIN(grove_reduction_context, max_completion_length, 36);
PIN(grove_reduction_context, generation_batch_tokens, 40);
PIN(grove_reduction_context, generation_batch_sequences, 48);
PIN(grove_reduction_context, optimizer_window_tokens, 56);
PIN_SIZE(grove_reduction_context, 64);

PIN(grove_reduction_api, struct_size, 0);
PIN(grove_reduction_api, weights, 8);
PIN_SIZE(grove_reduction_api, 16);

PIN(grove_tensor_ops, struct_size, 0);
PIN(grove_tensor_ops, parameter, 8);
PIN(grove_tensor_ops, linear, 16);
PIN(grove_tensor_ops, matmul, 24);
PIN(grove_tensor_ops, add, 32);
PIN(grove_tensor_ops, mul, 40);
PIN(grove_tensor_ops, scale, 48);
PIN(grove_tensor_ops, dropout, 56);
PIN(grove_tensor_ops, shape, 64);
PIN(grove_tensor_ops, base_weight, 72); /* ABI 1.13 */
PIN(grove_tensor_ops, base_output, 80);
PIN(grove_tensor_ops, parameter_from, 88);
PIN(grove_tensor_ops, detach, 96);
PIN(grove_tensor_ops, div, 104);
PIN(grove_tensor_ops, row_norm, 112);
PIN(grove_tensor_ops, reshape, 120);
PIN_SIZE(grove_tensor_ops, 128);

PIN(grove_linear_info, struct_size, 0);
PIN(grove_linear_info, name, 8);
PIN(grove_linear_info, short_name, 16);
PIN(grove_linear_info, in_features, 24);
PIN(grove_linear_info, out_features, 32);
PIN(grove_linear_info, layer_index, 40);
PIN(grove_linear_info, has_bias, 44);
PIN_SIZE(grove_linear_info, 48);

PIN(grove_text_sink, struct_size, 0);
PIN(grove_text_sink, host_data, 8);
PIN(grove_text_sink, append, 16);
PIN_SIZE(grove_text_sink, 24);

PIN(grove_adapter_api, struct_size, 0);
PIN(grove_adapter_api, attach, 8);
PIN(grove_adapter_api, forward, 16);
PIN(grove_adapter_api, merged_delta, 24);
PIN(grove_adapter_api, detach, 32);
PIN(grove_adapter_api, saved_config_json, 40);
PIN_SIZE(grove_adapter_api, 48);

/* The inline helpers are C too: exercised here and called from the C++ test. */
double grove_c_config_probe(void) {
    static const char* const names[] = {"alpha", "r"};
    grove_config_value values[2];
    grove_config config;
    values[0].struct_size = sizeof(grove_config_value);
    values[0].key = names[0];
    values[0].type = GROVE_VALUE_FLOAT;
    values[0].float_value = 2.5;
    values[1].struct_size = sizeof(grove_config_value);
    values[1].key = names[1];
    values[1].type = GROVE_VALUE_INT;
    values[1].int_value = 16;
    config.struct_size = sizeof config;
    config.count = 2;
    config.values = values;
    config.raw_toml = "";
    config.source_name = "c";
    config.base_dir = "/";
    /* 2.5 + 16 + 7 (fallback for a missing key) + 0 (prefix "al" must not match "alpha") */
    return grove_config_float(&config, "alpha", -1.0) + (double)grove_config_int(&config, "r", -1) +
           grove_config_float(&config, "missing", 7.0) + (grove_config_find(&config, "al") ? 100.0 : 0.0);
}

size_t grove_c_sizeof_descriptor(void) { return sizeof(grove_plugin_descriptor); }

/* ABI 1.2: environments */
PIN(grove_environment_batch, struct_size, 0);
PIN(grove_environment_batch, count, 4);
PIN(grove_environment_batch, episodes, 8);
PIN(grove_environment_batch, turns, 16);
PIN(grove_environment_batch, turn_texts, 24);
PIN(grove_environment_batch, turn_token_offsets, 32);
PIN(grove_environment_batch, turn_tokens, 40);
PIN(grove_environment_batch, turn_ended_with_eos, 48);
PIN(grove_environment_batch, prompts, 56);
PIN(grove_environment_batch, row_json, 64);
PIN(grove_environment_batch, step, 72);
PIN(grove_environment_batch, seed, 80);
PIN(grove_environment_batch, prompt_json, 88); /* ABI 1.7 */
PIN_SIZE(grove_environment_batch, 96);

PIN(grove_environment_output, struct_size, 0);
PIN(grove_environment_output, observations, 8);
PIN(grove_environment_output, done, 16);
PIN(grove_environment_output, tool_calls, 24);
PIN(grove_environment_output, tool_failures, 32);
PIN_SIZE(grove_environment_output, 40);

PIN(grove_environment_api, struct_size, 0);
PIN(grove_environment_api, stop_strings, 8);
PIN(grove_environment_api, step, 16);
PIN(grove_environment_api, score_episodes, 24); /* ABI 1.3, appended */
PIN(grove_environment_api, begin_episodes, 32); /* ABI 1.7 */
PIN(grove_environment_api, tools_json, 40);     /* ABI 1.7 */
PIN(grove_environment_api, episode_reward, 48); /* ABI 1.9 */
PIN_SIZE(grove_environment_api, 56);

/* ABI 1.5: objectives */
PIN(grove_objective_batch, struct_size, 0);
PIN(grove_objective_batch, rows, 4);
PIN(grove_objective_batch, columns, 8);
PIN(grove_objective_batch, logp, 16);
PIN(grove_objective_batch, old_logp, 24);
PIN(grove_objective_batch, ref_logp, 32);
PIN(grove_objective_batch, mask, 40);
PIN(grove_objective_batch, weights, 48);
PIN(grove_objective_batch, advantages, 56);
PIN(grove_objective_batch, beta, 64);
PIN(grove_objective_batch, epsilon, 72);
PIN(grove_objective_batch, epsilon_high, 80);
PIN(grove_objective_batch, delta, 88);
PIN(grove_objective_batch, importance_level, 96);
PIN(grove_objective_batch, use_bias_correction_kl, 100);
PIN(grove_objective_batch, policy_mask, 104); /* ABI 1.6, appended */
PIN(grove_objective_batch, sampling_ratio, 112);
PIN_SIZE(grove_objective_batch, 120);

PIN(grove_objective_output, struct_size, 0);
PIN(grove_objective_output, loss, 8);
PIN(grove_objective_output, grad, 16);
PIN(grove_objective_output, metric_count, 24);
PIN(grove_objective_output, metric_sums, 32);
PIN(grove_objective_output, metric_counts, 40);
PIN_SIZE(grove_objective_output, 48);

PIN(grove_objective_api, struct_size, 0);
PIN(grove_objective_api, metric_aggregation, 8);
PIN(grove_objective_api, loss, 16);
PIN_SIZE(grove_objective_api, 24);
