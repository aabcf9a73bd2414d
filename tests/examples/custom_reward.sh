#!/usr/bin/env bash
# Installs Grove into a scratch prefix, builds examples/custom-reward (a C and a C++ plugin) against the
# INSTALLED SDK only (CMake package and pkg-config), and has the installed grove load both by path.
set -euo pipefail
build=$1 source=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$source/examples/custom-reward" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" >/dev/null
test -f "$work/build/libkeyword_reward.so"
test -f "$work/build/libworked_steps_reward.so"
# the pkg-config route gives the same include path
cflags=$(PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig" pkg-config --cflags grove-sdk)
cc $cflags -std=c99 -Wall -Wextra -Werror -shared -fPIC -o "$work/libkeyword_pkgconfig.so" \
  "$source/examples/custom-reward/keyword_reward.c"
c++ $cflags -std=c++17 -Wall -Wextra -Werror -shared -fPIC -fvisibility=hidden -o "$work/libworked_steps_pkgconfig.so" \
  "$source/examples/custom-reward/worked_steps_reward.cpp"
sed "s|\.\./\.\./build-keyword/|$work/build/|" \
  "$source/examples/custom-reward/grove.toml" > "$work/grove.toml"
out=$("$work/prefix/bin/grove" check "$work/grove.toml")
echo "$out" | grep -q "reward     keyword 1.0.0" || { echo "installed grove did not load the example: $out"; exit 1; }
echo "$out" | grep -q "reward     worked_steps 1.0.0" || { echo "installed grove did not load the C++ example: $out"; exit 1; }
echo "$out" | grep -q "reward     correctness 1.0.0" || { echo "installed grove did not find its own plugins: $out"; exit 1; }
echo "custom-reward example: built against $work/prefix and loaded by the installed grove"
