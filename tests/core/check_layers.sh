#!/usr/bin/env bash
# The dependency rules of docs/architecture.md, checked on the source tree:
#   - core/src/{config,plugins,io,text,grpo} (grove_core) never include libtorch;
#   - plugins/ and examples/ see only the SDK's headers; sdk/ includes nothing of Grove's but itself;
#   - core/ never includes a plugin's or a host's source.
# Usage: check_layers.sh SOURCE_DIR
set -u
cd "$1" || exit 2
status=0
fail() { echo "layer rule broken: $*"; status=1; }

torch_pattern='#include[[:space:]]*[<"](ATen|torch|c10|caffe2)/'
for folder in config plugins io text grpo; do
  hits=$(grep -rnE "$torch_pattern" "core/src/$folder" || true)
  [ -z "$hits" ] || fail "core/src/$folder is grove_core (no libtorch) but includes it:
$hits"
done
# the public headers grove_core's folders include must be torch-free too
for header in $(grep -rhoE '#include "grove/[a-z_]+\.hpp"' core/src/{config,plugins,io,text,grpo} | sed 's/.*"grove\///; s/"//' | sort -u); do
  [ -f "core/include/grove/$header" ] || continue  # generated (version.hpp)
  hits=$(grep -nE "$torch_pattern" "core/include/grove/$header" || true)
  [ -z "$hits" ] || fail "core/include/grove/$header is used by grove_core but includes libtorch: $hits"
done
sdk_only='#include[[:space:]]*[<"]grove/(grove_plugin\.h|plugin\.hpp)[>"]'
hits=$(grep -rnE '#include[[:space:]]*[<"]grove/' plugins examples | grep -vE "$sdk_only" || true)
[ -z "$hits" ] || fail "plugins/ and examples/ may include only the SDK (grove/grove_plugin.h, grove/plugin.hpp):
$hits"
hits=$(grep -rnE '#include[[:space:]]*"' sdk/include | grep -vE '#include[[:space:]]*"grove_plugin\.h"' || true)
[ -z "$hits" ] || fail "sdk/ includes something besides itself:
$hits"
hits=$(grep -rnE '#include[[:space:]]*"[^"]*(\.\./|plugins/[a-z_]+/|hosts/)' core || true)
[ -z "$hits" ] || fail "core/ includes a plugin's or a host's file:
$hits"
[ $status = 0 ] && echo "layer rules hold"
exit $status
