//! The listeners' refused connections and live streams on `/metrics`, read from the
//! counters the accept loops keep ([`crate::net::conn_limit::ConnStats`]).

use super::put;
use crate::families::{Num, value};
use crate::net::conn_limit::{ConnStats, Listener};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

/// Adds the listeners' refusal counters and the live-stream gauge to `registry`.
pub fn register(stats: &Arc<ConnStats>, registry: &mut Registry) {
    registry.register_collector(Box::new(StatsCollector(Arc::clone(stats))));
}

#[derive(Debug)]
struct StatsCollector(Arc<ConnStats>);

impl Collector for StatsCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let s = &self.0;
        // Counter names without `_total`: the encoder adds it.
        let mut m = enc.encode_descriptor(
            "gpufleet_connections_refused",
            "Connections refused for exceeding --max-connections-per-ip, per listener; \
             answered: whether the client got a 503 / UNAVAILABLE (false: too many \
             refusals at once, closed unanswered).",
            None,
            MetricType::Counter,
        )?;
        for listener in [Listener::Http, Listener::Grpc] {
            let l = s.of(listener);
            for (answered, n) in [
                ("true", &l.refused_answered),
                ("false", &l.refused_unanswered),
            ] {
                let labels = [("listener", listener.as_str()), ("answered", answered)];
                put(
                    &mut m,
                    &labels,
                    MetricType::Counter,
                    Num::U(n.load(Relaxed)),
                )?;
            }
        }
        let mut m = enc.encode_descriptor(
            "gpufleet_live_streams",
            "Live streams (/api/v1/live) open now.",
            None,
            MetricType::Gauge,
        )?;
        value(
            &mut m,
            MetricType::Gauge,
            Num::U(s.http.live_open.load(Relaxed)),
        )?;
        let mut m = enc.encode_descriptor(
            "gpufleet_live_streams_refused",
            "Live streams refused by --max-live-streams-per-ip or --max-live-streams.",
            None,
            MetricType::Counter,
        )?;
        value(
            &mut m,
            MetricType::Counter,
            Num::U(s.http.live_refused.load(Relaxed)),
        )
    }
}
