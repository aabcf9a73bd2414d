#!/usr/bin/env bash
# The device kit's CPU rehearsal (ctest device_kit_rehearsal): the bundle is built, moved to a folder of
# its own and run there on the CPU with only its own libraries and torch's on the library path, so a
# library, plugin or path missing from it fails here, not in the first paid minutes on a GPU. Its
# correctness section then runs a second time against transformers 5 (the GPU machines' version,
# installed by .ci/deps.sh beside the venv's 4.57), so the two versions' disagreements show up here too.
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
transformers5=$("$python" -c 'import sys; print(sys.prefix)')/transformers5-site
[[ -d $transformers5/transformers ]] || { echo "no transformers 5 in $transformers5: run 'make deps'" >&2; exit 1; }
env -u LD_LIBRARY_PATH -u GROVE_PLUGIN_PATH PYTHON="$python" PYTHONPATH="$transformers5" \
  bash bundle/run.sh --cpu --only environment,correctness --out "$work/report5"
# every section ran and passed (run.sh exits non-zero on a failure; this also catches a skipped one)
"$python" - "$work/report/report.json" "$work/report5/report.json" <<'PY'
import json, sys
def passed(report, expected, transformers):
    sections = json.load(open(report))["sections"]
    assert list(sections) == expected, f"sections {list(sections)}, expected {expected}"
    failed = [name for name, s in sections.items() if s["status"] != "pass"]
    assert not failed, f"failed: {failed}"
    found = sections["environment"]["figures"]["transformers"]
    assert found.split(".")[0] == transformers, f"ran against transformers {found}, expected {transformers}.x"
    print(f"rehearsal passed against transformers {found}: {', '.join(expected)}")
passed(sys.argv[1], ["environment", "correctness", "training", "distributed", "generation", "step", "trace"], "4")
passed(sys.argv[2], ["environment", "correctness"], "5")
PY
