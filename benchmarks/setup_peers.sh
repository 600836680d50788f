#!/usr/bin/env bash
# Create benchmarks/.venv-peers and install the peer job queues from PyPI.
#
# Peers (arq, taskiq + taskiq-redis, saq, streaq) are never vendored: they live
# only in throw-away virtualenvs under benchmarks/.venv-peers/ (git-ignored).
#
#   benchmarks/.venv-peers/                 runner venv: redis[hiredis] + matplotlib;
#                                           runs run_peers.py and peers/raw_streams.py
#   benchmarks/.venv-peers/peers/<name>/    one venv per peer, holding only that peer
#
# Why one venv per peer: their declared redis-py pins are mutually exclusive
# (arq: redis<6, saq[redis]: redis<8, taskiq-redis: redis>=8), so a single venv
# would run at least one peer on a redis-py it does not support.  Each peer is
# installed unpinned and gets whatever pip resolves for it alone.
#
# aqw is always reinstalled from this repository (--force-reinstall --no-deps after
# its dependencies are in place), so the code measured is the working tree's, even
# when the version number did not change.
#
# A peer that fails to install is reported and skipped (run_peers.py only runs
# peers whose venv imports); this script still exits 0 in that case.
#
#   bash benchmarks/setup_peers.sh
#   benchmarks/.venv-peers/bin/python benchmarks/run_peers.py
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$here/.venv-peers"
python="${PYTHON:-python3}"
logs="$root/logs"

# make_venv DIR: create DIR as a venv unless it already is one.
make_venv() {
    [[ -x "$1/bin/python" ]] || "$python" -m venv "$1"
}

# pip_install VENV LOGNAME SPEC...: quiet install, full output kept in a log.
pip_install() {
    local venv="$1" log="$logs/$2.log"
    shift 2
    "$venv/bin/python" -m pip install --disable-pip-version-check "$@" >"$log" 2>&1
}

make_venv "$root" || { echo "setup_peers: cannot create $root" >&2; exit 1; }
mkdir -p "$logs" "$root/peers"

if ! pip_install "$root" runner "redis[hiredis]>=5" matplotlib; then
    echo "setup_peers: runner venv install failed, see $logs/runner.log" >&2
    tail -n 20 "$logs/runner.log" >&2
    exit 1
fi

# name|pip specs|import check
# saq 0.26.x imports typing_extensions without declaring it, so it is named here.
peers=(
    "aqw|$here/..|import aqw"
    "arq|arq|import arq"
    "taskiq|taskiq taskiq-redis|import taskiq, taskiq_redis"
    "saq|saq[redis,hiredis] typing_extensions|import saq"
    "streaq|streaq|import streaq"
)

installed=()
failed=()
for entry in "${peers[@]}"; do
    IFS='|' read -r name specs check <<<"$entry"
    venv="$root/peers/$name"
    # shellcheck disable=SC2086  # specs is a deliberate word list
    if make_venv "$venv" && pip_install "$venv" "$name" $specs \
        && { [[ "$name" != aqw ]] \
            || pip_install "$venv" aqw-reinstall --no-deps --force-reinstall "$here/.."; } \
        && "$venv/bin/python" -c "$check" 2>>"$logs/$name.log"; then
        installed+=("$name")
    else
        echo "setup_peers: WARNING: $name ($specs) failed to install;" \
            "continuing without it (log: $logs/$name.log)" >&2
        tail -n 5 "$logs/$name.log" >&2
        rm -rf "$venv"
        failed+=("$name")
    fi
done

echo "setup_peers: runner venv: $root"
echo "setup_peers: installed peers: ${installed[*]:-none}"
if ((${#failed[@]})); then
    echo "setup_peers: NOT installed (run_peers.py will skip them): ${failed[*]}"
fi
for name in "${installed[@]}"; do
    versions="$("$root/peers/$name/bin/python" -m pip list --disable-pip-version-check 2>/dev/null \
        | awk 'tolower($1) ~ /^(arq|taskiq|taskiq-redis|saq|streaq|redis|hiredis|coredis)$/ \
               {printf "%s==%s ", $1, $2}')"
    echo "  $name: $versions"
done
exit 0
