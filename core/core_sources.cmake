# grove_core's sources, listed once: the library (core/CMakeLists.txt) and the sanitizer build of
# the fuzz targets (tests/fuzz/CMakeLists.txt) both compile them. Paths are relative to core/.
set(GROVE_CORE_SOURCES
  src/config/manifest.cpp
  src/config/manifest_schema.cpp
  src/config/run_config.cpp
  src/config/plugin_use.cpp
  src/config/toml_input.cpp
  src/plugins/plugin_host.cpp
  src/plugins/environment_host.cpp
  src/plugins/worker_protocol.cpp
  src/plugins/plugin_worker.cpp
  src/plugins/isolated_reward.cpp
  src/io/mapped_file.cpp
  src/io/safetensors.cpp
  src/io/gguf.cpp
  src/io/dataset.cpp
  src/io/rollouts_file.cpp
  src/io/json_values.cpp
  src/io/file_checksum.cpp
  src/io/tensorboard_events.cpp
  src/io/loopback_port.cpp
  src/io/hub_cache.cpp
  src/text/text_util.cpp
  src/text/tokenizer.cpp
  src/grpo/advantages.cpp
  src/grpo/reward_set.cpp)
list(TRANSFORM GROVE_CORE_SOURCES PREPEND ${CMAKE_CURRENT_LIST_DIR}/)
