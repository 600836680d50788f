#!/usr/bin/env bash
# The whole benchmark comparison in one command (see benchmarks/compare.py):
#
#   bash benchmarks/compare.sh              # full: ~20 min on a 2-core machine
#   bash benchmarks/compare.sh --quick      # smoke run of the pipeline: ~3-5 min
#   bash benchmarks/compare.sh --with-sqs   # also the SQS figures (fauxqs, needs node/npm)
#
# 1. setup_peers.sh: the runner venv and one venv per peer; aqw is reinstalled from this
#    working tree, so the current code is what gets measured;
# 2. compare.py (runner venv): every peer x {no-op, sleep 10 ms} x concurrency {10, 100},
#    then aqw_extra.py (and sqs_bench.py); writes benchmarks/results/compare.json,
#    docs/img/benchmarks.png and docs/benchmarks.md.
#
# Redis: 127.0.0.1:6379 db 13 only, flushed before and after.  Extra arguments go to
# compare.py (--repeat N, --only PEER..., --aqw-python PATH, --render-only).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/.."

if [[ " $* " != *" --render-only "* ]]; then
    echo "[compare] setup_peers.sh ..." >&2
    bash "$here/setup_peers.sh"
fi
exec "$here/.venv-peers/bin/python" "$here/compare.py" "$@"
