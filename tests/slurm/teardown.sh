#!/bin/bash
# Stop the test cluster's daemons by the PIDs in their pid files.
BASE=${BASE:-/tmp/pipeline-slurm}
for f in $BASE/run/*.pid $BASE/munge/munged.pid; do
  [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null
done
exit 0
