#!/usr/bin/env bash
# One command on a GPU machine: checks Grove's CUDA path against transformers and measures it against
# transformers and TRL, writing report.md and report.json (default folder: ./device-report, or $OUT).
#   bash run.sh [--cpu] [--out DIR] [--only SECTION[,SECTION]] [--skip SECTION[,SECTION]]
# --cpu is the rehearsal: the same checks on the CPU, so a missing library or path shows up before a
# GPU is paid for. Sections: environment, correctness, training, distributed, generation, step (check.py --help).
set -euo pipefail
bundle=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
torch_lib=$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))') || {
  echo "run.sh: $python cannot import torch; set PYTHON to an interpreter with torch 2.11" >&2
  exit 1
}

# large Debian libraries travel xz-compressed; unpack them once, next to the others
for packed in "$bundle"/lib/*.xz; do
  [[ -e $packed ]] || continue
  [[ -e ${packed%.xz} ]] || "$python" -c 'import lzma, sys; open(sys.argv[2], "wb").write(lzma.open(sys.argv[1]).read())' \
    "$packed" "${packed%.xz}"
done
export LD_LIBRARY_PATH="$bundle/lib:$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# TRL and the datasets version it needs, only where the interpreter lacks them
if ! "$python" -c 'import trl' 2>/dev/null && compgen -G "$bundle/wheels/*.whl" >/dev/null; then
  site=${TMPDIR:-/tmp}/grove-device-site
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$bundle"/wheels/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
exec "$python" "$bundle/check.py" --bundle "$bundle" "$@"
