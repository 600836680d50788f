#!/usr/bin/env bash
# aqw's PostgreSQL broker against pgqueuer (from PyPI, in its own throw-away venv under
# benchmarks/.venv-pg-peers, git-ignored), interleaved rounds on the same PostgreSQL:
#
#   bash benchmarks/pg/run.sh [DSN] [JOBS] [CONCURRENCY] [ROUNDS]
#
# Each run prints one JSON line (drain jobs/s, bulk and single enqueue/s); the figures to
# compare are those of one run of this script (the machine's load moves absolute rates).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
dsn="${1:-postgresql://postgres@127.0.0.1:5432/test}"
jobs="${2:-5000}"
conc="${3:-100}"
rounds="${4:-3}"
peers="$root/benchmarks/.venv-pg-peers"
[[ -x "$peers/bin/python" ]] || python3 -m venv "$peers"
"$peers/bin/python" -c "import pgqueuer" 2>/dev/null || "$peers/bin/pip" install -q pgqueuer asyncpg
aqw_python="${AQW_PYTHON:-python}"
for ((r = 1; r <= rounds; r++)); do
    PYTHONPATH="$root" "$aqw_python" "$here/bench_aqw.py" "$dsn" "$jobs" "$conc"
    "$peers/bin/python" "$here/bench_pgqueuer.py" "$dsn" "$jobs" "$conc"
done
