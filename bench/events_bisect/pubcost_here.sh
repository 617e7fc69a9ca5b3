#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/events_bisect/pubcost_here.sh BUILD OUT: compiles pubcost.c against
# the events libraries of an existing build folder (today's API names), so
# that each step of a change can be counted without a worktree and a full
# build per commit (pubcost.sh does that for any older commit). Then:
#   bench/events_bisect/cg.sh OUT K FORM 1   # publisher and subscriber Ir/block
#   PUBCOST_STAGE=256 bench/events_bisect/cg.sh OUT K FORM 0   # through a stage of 256 events
#   PUBCOST_BATCH=64 bench/events_bisect/cg.sh OUT K FORM 0    # 64 events a publish_batch call
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "$1" && pwd) out=$2
src=$(mktemp --suffix=.c)
trap 'rm -f "$src"' EXIT
sed 's/PUBCFG_DEFAULT/kvbm_publisher_config_default/;s/PUBCFG/kvbm_publisher_config/;s/ZCFG_DEFAULT/kvbm_zmq_sink_config_default/;s/ZCFG/kvbm_zmq_sink_config/;s/SUBCFG_DEFAULT/kvbm_subscriber_config_default/;s/SUBCFG/kvbm_subscriber_config/' \
  "$here/pubcost.c" >"$src"
cc -O2 -g -D_GNU_SOURCE -DPUBCOST_STAGE -DPUBCOST_BATCH -std=c11 -I"$here/../../include" -I"$here/../../src" "$src" -o "$out" \
  "$build/libkvbm_events.a" "$build/libkvbm_event_codec.a" "$build/libkvbm_metrics.a" \
  "$build/libkvbm_common.a" -lzmq -lnats -lmsgpackc -lpthread -lm
