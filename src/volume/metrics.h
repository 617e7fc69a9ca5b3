/* SPDX-License-Identifier: Apache-2.0 */
/*
 * volume/metrics.h (private): a volume's counters written with the labels
 * the caller names it by (kvbm_volume_metrics_collect: `volume` = its
 * name; the manager: `tier` = the tier it serves).
 */
#ifndef KVBM_VOLUME_METRICS_H
#define KVBM_VOLUME_METRICS_H

#include "kvbm/metrics.h"
#include "kvbm/volume.h"

void kvbm__volume_metrics_write(kvbm_metrics_writer *w, const kvbm_volume_stats *s,
                                const kvbm_metric_label *labels, size_t num_labels);

#endif
