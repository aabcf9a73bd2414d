#!/usr/bin/env bash
# The device kit's CPU rehearsal (ctest device_kit_rehearsal): the bundle is built, moved to a folder of
# its own and run there on the CPU with only its own libraries and torch's on the library path, so a
# library, plugin or path missing from it fails here, not in the first paid minutes on a GPU.
#   device_rehearsal.sh BUILD_DIR PYTHON
set -euo pipefail
build=$1 python=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bash "$(dirname "$0")/../../tools/device/make_bundle.sh" "$build" "$work/made"
mv "$work/made" "$work/bundle"
size_mib=$(du -sm "$work/bundle" | cut -f1)
((size_mib <= 60)) || { echo "the bundle is $size_mib MiB; the GPU machine takes at most 60" >&2; exit 1; }
cd "$work"
env -u LD_LIBRARY_PATH -u GROVE_PLUGIN_PATH PYTHON="$python" bash bundle/run.sh --cpu --out "$work/report"
# every section ran and passed (run.sh exits non-zero on a failure; this also catches a skipped one)
"$python" - "$work/report/report.json" <<'PY'
import json, sys
sections = json.load(open(sys.argv[1]))["sections"]
expected = ["environment", "correctness", "training", "distributed", "generation", "step", "trace"]
assert list(sections) == expected, f"sections {list(sections)}, expected {expected}"
failed = [name for name, s in sections.items() if s["status"] != "pass"]
assert not failed, f"failed: {failed}"
print(f"rehearsal passed: {', '.join(expected)}")
PY
