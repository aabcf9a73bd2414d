"""Reads a run's TensorBoard events with TensorBoard's own loader and checks them against its
metrics.jsonl: every finite value of every line is one scalar, at that line's step, under the tag
transformers' TensorBoardCallback gives it (rewrite_logs), equal to the value as a float32; no tag
has a step twice (a resumed run must not leave the steps it logged again behind).
    check_tensorboard.py RUN_DIR"""
import json
import math
import struct
import sys
from collections import defaultdict
from pathlib import Path

from tensorboard.backend.event_processing import event_accumulator
from transformers.integrations.integration_utils import rewrite_logs

run = Path(sys.argv[1])
# purging off: the test is that Grove's file holds each step once, not that TensorBoard hides repeats
events = event_accumulator.EventAccumulator(str(run / "runs"), size_guidance={event_accumulator.SCALARS: 0},
                                            purge_orphaned_data=False)
events.Reload()
found = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}

expected = defaultdict(list)
for line in (run / "metrics.jsonl").read_text().splitlines():
    row = json.loads(line)
    step = row.pop("step")
    for tag, value in rewrite_logs(row).items():
        if value is not None and math.isfinite(value):
            expected[tag].append((step, struct.unpack("f", struct.pack("f", value))[0]))

problems = [f"{tag}: TensorBoard has {found.get(tag)}, metrics.jsonl {values}"
            for tag, values in expected.items() if found.get(tag) != values]
problems += [f"{tag}: in TensorBoard only" for tag in found if tag not in expected]
if not expected:
    problems.append("metrics.jsonl has no values")
if problems:
    sys.exit("\n".join(problems[:20]))
steps = sorted({s for values in expected.values() for s, _ in values})
print(f"TensorBoard reads {len(expected)} tags at steps {steps}, equal to metrics.jsonl")
