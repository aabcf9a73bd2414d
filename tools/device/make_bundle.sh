#!/usr/bin/env bash
# Packs what a bare GPU machine needs to run Grove's device checks into one folder (`make device-bundle`).
#   tools/device/make_bundle.sh [BUILD_DIR] [OUT_DIR]     (defaults: build, build/device-bundle)
# The machine has torch 2.11.0+cu130 (the build Grove links) and transformers, but none of the Debian
# libraries Grove uses, no TRL and no network. So the bundle holds: stripped programs and libraries,
# the plugins, the Debian shared libraries found by ldd (large ones xz-compressed, unpacked by run.sh),
# the tiny checkpoints with their transformers references, the check and bench scripts, and the wheels
# of the pure-Python packages the TRL comparison needs. libtorch itself comes from the machine.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(realpath -m "${1:-$root/build}")
out=$(realpath -m "${2:-$build/device-bundle}")
python=${GROVE_PYTHON:-$root/.venv/bin/python}

for need in "$build/bin/grove" "$build/bin/grove_bench_generate" "$build/bin/test_distributed" \
  "$build/tests/core/test-plugins/liblow_ids.so"; do
  [[ -e $need ]] || { echo "make_bundle.sh: $need is missing; run \`make build\` first" >&2; exit 1; }
done
# the tiny checkpoints and their transformers references, as the tests make them
tiny=$build/tests/models/tiny
[[ -e $tiny/llama_gqa/reference.safetensors ]] || "$python" "$root/tests/core/model/make_tiny_models.py" "$tiny" >/dev/null
rm -rf "$out"
mkdir -p "$out"/{bin,lib/grove/plugins,test-plugins,models,wheels}

install -m 755 "$build/bin/grove" "$build/bin/grove_bench_generate" "$build/bin/test_distributed" "$out/bin/"
cp "$build"/lib/libgrove_*.so "$out/lib/"
cp "$build"/lib/grove/plugins/*.so "$out/lib/grove/plugins/"
install -m 755 "$build/lib/grove/grove-plugin-worker" "$out/lib/grove/"  # [[rewards]] isolation = "process"
cp "$build"/tests/core/test-plugins/*.so "$out/test-plugins/"
strip --strip-unneeded "$out"/bin/* "$out"/lib/*.so "$out"/lib/grove/plugins/*.so "$out"/test-plugins/*.so
# only the bundle's own folder on the run path: a library missing from it shows up in the rehearsal
for f in "$out"/bin/* "$out"/lib/*.so; do patchelf --set-rpath '$ORIGIN/../lib' "$f"; done
strip --strip-unneeded "$out/lib/grove/grove-plugin-worker"
patchelf --set-rpath '$ORIGIN/..' "$out/lib/grove/grove-plugin-worker"

# Debian libraries the programs need, minus the C/C++ runtime (newer on the machine) and libtorch's own
system_libs=$(ldd "$out"/bin/* "$out"/lib/*.so "$out"/lib/grove/plugins/*.so 2>/dev/null |
  awk '$3 ~ /^\/(usr\/)?lib/ {print $3}' | sort -u |
  grep -Ev '/(libc|libm|libdl|librt|libpthread|libutil|libgcc_s|libstdc\+\+|ld-linux-x86-64)\.so' || true)
for lib in $system_libs; do
  if (($(stat -Lc %s "$lib") > 4 * 1024 * 1024)); then
    xz -T2 -6 -c "$lib" >"$out/lib/$(basename "$lib").xz"
  else
    cp -L "$lib" "$out/lib/"
  fi
done

cp -r "$build/tests/models/tiny" "$out/models/"
cp "$root"/tools/device/{run.sh,check.py,trace_kernels.py} "$root"/bench/{generate.py,step.py} "$out/"
# TRL is absent on the machine; these pure-Python wheels (and their missing dependencies) travel along
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d "$out/wheels" \
  trl==1.16.0 datasets==5.0.1 dill==0.4.1 multiprocess==0.70.19 >/dev/null
git -C "$root" rev-parse HEAD >"$out/COMMIT" 2>/dev/null || echo unknown >"$out/COMMIT"
echo "device bundle: $out ($(du -sh "$out" | cut -f1))"
