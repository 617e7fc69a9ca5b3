# SPDX-License-Identifier: Apache-2.0
"""kvbm.Manager's metrics endpoint: switched on by keyword or, as Dynamo
does, by DYN_KVBM_METRICS through env; scraped over HTTP like Prometheus."""
import re
import urllib.request

import pytest

import kvbm


def scrape(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
        assert r.status == 200
        assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        return r.read().decode()


def value(page, series):
    m = re.search(r"^%s (\S+)$" % re.escape(series), page, re.M)
    assert m, series + " not on the page"
    return float(m.group(1))


def test_endpoint_by_keyword():
    with kvbm.Manager(g1_blocks=64, g2_blocks=128, metrics=True, metrics_port=0,
                      metrics_host="127.0.0.1") as m:
        assert m.metrics_port
        page = scrape(m.metrics_port)
        assert value(page, 'kvbm_tier_capacity_blocks{tier="G1"}') == 64
        assert value(page, 'kvbm_tier_capacity_blocks{tier="G2"}') == 128
        assert value(page, "kvbm_requested_tokens_total") == 0
        with m.prefill(list(range(40))) as r:
            r.wait(timeout=30)
            r.commit()
        m.flush()
        page = scrape(m.metrics_port)
        assert value(page, "kvbm_prefill_requests_total") == 1
        assert value(page, "kvbm_requested_tokens_total") == 40
        assert value(page, "kvbm_offload_blocks_d2h") == 2  # two full blocks of 16
        assert m.metrics_text().startswith("# HELP kvbm_offload_blocks_d2h")


def test_off_by_default():
    with kvbm.Manager(g1_blocks=16) as m:
        assert m.metrics_port is None
        text = m.metrics_text()  # rendered without an endpoint
        assert value(text, 'kvbm_tier_capacity_blocks{tier="G1"}') == 16


def test_dynamo_environment():
    env = {"DYN_KVBM_METRICS": "true", "DYN_KVBM_METRICS_PORT": "0",
           "KVBM_METRICS_HOST": "127.0.0.1"}
    with kvbm.Manager(g1_blocks=16, env=env) as m:
        assert m.metrics_port
        assert value(scrape(m.metrics_port), "kvbm_prefill_requests_total") == 0
    # the keyword wins over the environment
    with kvbm.Manager(g1_blocks=16, env=env, metrics=False) as m:
        assert m.metrics_port is None
    with pytest.raises(kvbm.InvalidArgumentError, match="DYN_KVBM_METRICS"):
        kvbm.Manager(g1_blocks=16, env={"DYN_KVBM_METRICS": "perhaps"})


def test_bad_settings():
    with pytest.raises(kvbm.InvalidArgumentError, match="IPv4"):
        kvbm.Manager(g1_blocks=16, metrics=True, metrics_port=0, metrics_host="nowhere")
    with pytest.raises((ValueError, OverflowError)):
        kvbm.Manager(g1_blocks=16, metrics=True, metrics_port=70000)
    with kvbm.Manager(g1_blocks=16, metrics=True, metrics_port=0, metrics_host="127.0.0.1") as m:
        with pytest.raises(kvbm.Error, match="cannot listen"):
            kvbm.Manager(g1_blocks=16, metrics=True, metrics_port=m.metrics_port,
                         metrics_host="127.0.0.1")
