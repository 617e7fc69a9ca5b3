#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/events_bisect/pubcost.sh SHA [K] [FORM] [RUNS] [DIR]: builds
# pubcost.c against SHA's library (a worktree and build folder under DIR,
# default build-compare-ev, laid out as bench/compare.sh --dir lays them
# out), copies it to DIR/tools/pubcost-<sha7>, and runs it RUNS times with
# a decoding subscriber (JSON lines: CPU and context switches per block
# event of each side).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../.."
sha=$(git rev-parse "$1^{commit}"); k=${2:-1}; form=${3:--1}; runs=${4:-3}
root=$PWD/${5:-build-compare-ev} src=$root/src-$sha out=$root/$sha
mkdir -p "$root/tools"
[ -d "$src" ] || git worktree add --detach --force "$src" "$sha" >/dev/null 2>&1
cp "$here/pubcost.c" "$src/bench/bench_events.c"
if grep -q kvbm_publisher_config "$src/include/kvbm/events.h"; then
  sed -i 's/PUBCFG_DEFAULT/kvbm_publisher_config_default/;s/PUBCFG/kvbm_publisher_config/;s/ZCFG_DEFAULT/kvbm_zmq_sink_config_default/;s/ZCFG/kvbm_zmq_sink_config/;s/SUBCFG_DEFAULT/kvbm_subscriber_config_default/;s/SUBCFG/kvbm_subscriber_config/' "$src/bench/bench_events.c"
else
  sed -i 's/PUBCFG_DEFAULT/kvbm_publisher_options_default/;s/PUBCFG/kvbm_publisher_options/;s/ZCFG_DEFAULT/kvbm_zmq_sink_options_default/;s/ZCFG/kvbm_zmq_sink_options/;s/SUBCFG_DEFAULT/kvbm_subscriber_options_default/;s/SUBCFG/kvbm_subscriber_options/' "$src/bench/bench_events.c"
fi
[ -f "$out/CMakeCache.txt" ] || cmake -S "$src" -B "$out" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER_LAUNCHER=ccache >/dev/null
cmake --build "$out" -j2 --target bench_events >"$out.log" 2>&1 || { echo "build failed: $out.log" >&2; exit 1; }
(cd "$src" && git checkout -q bench/bench_events.c)
cp "$out/bench_events" "$root/tools/pubcost-${sha:0:7}"
for ((r = 0; r < runs; r++)); do "$out/bench_events" "$k" 1000000 "$form" 1; done
