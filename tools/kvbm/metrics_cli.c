/* SPDX-License-Identifier: Apache-2.0 */
/* metrics_cli.c: the metrics endpoint options (see metrics_cli.h). */
#include "metrics_cli.h"

#include <errno.h>
#include <string.h>

#include "cli.h"

bool metrics_cli_init(metrics_cli *m, const char *cmd) {
  memset(m, 0, sizeof *m);
  m->cfg = kvbm_metrics_server_config_default();
  kvbm_error err = {0};
  if (kvbm_metrics_server_config_env(&m->cfg, NULL, &err)) {
    fprintf(stderr, "kvbm %s: %s\n", cmd, err.msg);
    return false;
  }
  return true;
}

int metrics_cli_take(const char *cmd, int argc, char **argv, int *i, metrics_cli *m) {
  const char *v;
  uint64_t x;
  int r;
  if ((r = cli_opt_value(cmd, argc, argv, i, "--metrics-port", &v))) {
    if (r < 0 || !cli_parse_u64(cmd, "--metrics-port", v, 0, 65535, &x)) return -1;
    m->cfg.port = (uint16_t)x;
    m->cfg.enabled = true;
  } else if ((r = cli_opt_value(cmd, argc, argv, i, "--metrics-host", &v))) {
    if (r < 0) return -1;
    m->cfg.host = v; /* checked when the endpoint starts */
  } else if ((r = cli_opt_value(cmd, argc, argv, i, "--metrics-port-file", &v))) {
    if (r < 0) return -1;
    m->port_file = v;
  } else {
    return 0;
  }
  return 1;
}

bool metrics_cli_announce(const metrics_cli *m, const char *cmd, uint16_t port) {
  fprintf(stderr, "kvbm %s: metrics on http://%s:%u/metrics\n", cmd,
          m->cfg.host ? m->cfg.host : "0.0.0.0", port);
  if (!m->port_file) return true;
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", m->port_file);
  FILE *f = fopen(tmp, "w");
  if (!f || fprintf(f, "%u\n", port) < 0 || fclose(f) || rename(tmp, m->port_file)) {
    fprintf(stderr, "kvbm %s: --metrics-port-file %s: %s\n", cmd, m->port_file, strerror(errno));
    return false;
  }
  return true;
}

void metrics_cli_usage(FILE *f) {
  fprintf(f,
          "  --metrics-port N   serve GET /metrics (Prometheus) on port N (0: any free\n"
          "                     port); also switched on by DYN_KVBM_METRICS=true (port\n"
          "                     DYN_KVBM_METRICS_PORT, 6880; host KVBM_METRICS_HOST)\n"
          "  --metrics-host H   the address to listen on (default 0.0.0.0)\n"
          "  --metrics-port-file PATH  write the port there once it listens\n");
}
