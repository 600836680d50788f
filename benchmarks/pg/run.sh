#!/usr/bin/env bash
# aqw's PostgreSQL broker against pgqueuer and procrastinate (from PyPI, in their own
# throw-away venv under benchmarks/.venv-pg-peers, git-ignored; never aqw dependencies),
# interleaved rounds on the same PostgreSQL:
#
#   bash benchmarks/pg/run.sh [DSN] [JOBS] [CONCURRENCY] [ROUNDS]
#
# Each run prints one JSON line (drain jobs/s, bulk and single enqueue/s); the figures to
# compare are those of one run of this script (the machine's load moves absolute rates).
# procrastinate drains ~10x slower here: it runs PROCRASTINATE_JOBS jobs (default: JOBS, at
# most 2000) to keep a round short. AQW_BEFORE=DIR adds a round of the aqw checkout in DIR
# (e.g. `git archive COMMIT aqw | tar -x -C DIR`) beside this one: before/after in one run.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
dsn="${1:-postgresql://postgres@127.0.0.1:5432/test}"
jobs="${2:-5000}"
conc="${3:-100}"
rounds="${4:-3}"
peers="$root/benchmarks/.venv-pg-peers"
[[ -x "$peers/bin/python" ]] || python3 -m venv "$peers"
"$peers/bin/python" -c "import pgqueuer, procrastinate" 2>/dev/null ||
    "$peers/bin/pip" install -q pgqueuer procrastinate asyncpg
pjobs="${PROCRASTINATE_JOBS:-$((jobs < 2000 ? jobs : 2000))}"
aqw_python="${AQW_PYTHON:-python}"
for ((r = 1; r <= rounds; r++)); do
    if [[ -n "${AQW_BEFORE:-}" ]]; then
        PYTHONPATH="$AQW_BEFORE" "$aqw_python" "$here/bench_aqw.py" "$dsn" "$jobs" "$conc" |
            sed 's/"aqw-postgresql"/"aqw-postgresql-before"/'
    fi
    PYTHONPATH="$root" "$aqw_python" "$here/bench_aqw.py" "$dsn" "$jobs" "$conc"
    "$peers/bin/python" "$here/bench_pgqueuer.py" "$dsn" "$jobs" "$conc"
    "$peers/bin/python" "$here/bench_procrastinate.py" "$dsn" "$pjobs" "$conc" 2>/dev/null
done
