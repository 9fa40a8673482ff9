//! Optional server-side figures from gorge-notification's `/metrics` on the admin port
//! (Aphlict has none; then these stay empty): the hub's own fan-out time, which separates
//! server time from the load generator's share of POST→frame on two shared cores, the
//! server's own time to answer an admin POST, and the slow-consumer disconnects that confirm what happened to stuck sockets.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use serde::Serialize;

use crate::http1;

const FANOUT_BUCKET: &str = "gorge_notification_fanout_seconds_bucket";
const ADMIN_POST_BUCKET: &str = "gorge_notification_admin_post_seconds_bucket";
const SLOW_CONSUMERS: &str = "gorge_notification_slow_consumer_disconnects_total";

/// Series name (with labels) → value, from Prometheus text format.
#[derive(Debug, Default, Clone)]
pub struct Snapshot(HashMap<String, f64>);

pub async fn snapshot(admin: SocketAddr) -> Option<Snapshot> {
    let response = http1::get_once(admin, "/metrics", Duration::from_secs(2))
        .await
        .ok()?;
    if response.status != 200 {
        return None;
    }
    Some(parse(&String::from_utf8_lossy(&response.body)))
}

impl Snapshot {
    /// The sum of every series of family `name` whose labels contain `label` (e.g.
    /// `result="dropped"`; empty for all).
    pub fn sum_where(&self, name: &str, label: &str) -> f64 {
        self.0
            .iter()
            .filter(|(series, _)| {
                series
                    .strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with('{') || rest.is_empty())
                    && series.contains(label)
            })
            .map(|(_, value)| value)
            .sum()
    }

    /// Every counter series (family name ending in `_total`), with its labels.
    pub fn counters(&self) -> impl Iterator<Item = (&str, f64)> {
        self.0
            .iter()
            .filter(|(series, _)| {
                series
                    .split('{')
                    .next()
                    .is_some_and(|family| family.ends_with("_total"))
            })
            .map(|(series, value)| (series.as_str(), *value))
    }
}

fn parse(text: &str) -> Snapshot {
    Snapshot(
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                Some((series.to_string(), value.parse().ok()?))
            })
            .collect(),
    )
}

/// What changed on the server between two snapshots.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Delta {
    /// Upper bound (ms) of the histogram bucket holding the median / 99th percentile of
    /// "POST accepted → last frame queued".
    pub fanout_p50_le_ms: Option<f64>,
    pub fanout_p99_le_ms: Option<f64>,
    /// The same for the server's own time to answer an admin POST (the bench's admin POST
    /// figures also hold its own scheduling on shared cores).
    pub admin_post_p99_le_ms: Option<f64>,
    pub slow_consumer_disconnects: Option<f64>,
}

pub fn delta(before: &Snapshot, after: &Snapshot) -> Delta {
    let change = |series: &str| {
        after
            .0
            .get(series)
            .map(|a| a - before.0.get(series).unwrap_or(&0.0))
    };
    Delta {
        fanout_p50_le_ms: quantile_le_ms(before, after, FANOUT_BUCKET, 0.50),
        fanout_p99_le_ms: quantile_le_ms(before, after, FANOUT_BUCKET, 0.99),
        admin_post_p99_le_ms: quantile_le_ms(before, after, ADMIN_POST_BUCKET, 0.99),
        slow_consumer_disconnects: change(SLOW_CONSUMERS),
    }
}

/// Upper bound (ms) of the bucket holding quantile `q` of what the histogram `bucket`
/// (its `_bucket` series) counted between the snapshots.
fn quantile_le_ms(before: &Snapshot, after: &Snapshot, bucket: &str, q: f64) -> Option<f64> {
    let prefix = format!("{bucket}{{");
    let mut buckets: Vec<(f64, f64)> = after
        .0
        .iter()
        .filter(|(k, _)| k.starts_with(&prefix))
        .filter_map(|(k, a)| {
            let le = k.split("le=\"").nth(1)?.split('"').next()?;
            let bound = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((bound, a - before.0.get(k).unwrap_or(&0.0)))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last().map(|b| b.1).unwrap_or(0.0);
    if total <= 0.0 {
        return None;
    }
    // Buckets are cumulative: the first whose count reaches the rank holds the quantile.
    let rank = (q * total).ceil();
    buckets
        .iter()
        .find(|(_, count)| *count >= rank)
        .map(|(bound, _)| bound * 1000.0)
        .filter(|ms| ms.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_deltas_give_quantile_bounds() {
        let before = parse(
            "# HELP x\ngorge_notification_fanout_seconds_bucket{le=\"0.001\"} 5\ngorge_notification_fanout_seconds_bucket{le=\"0.002\"} 5\ngorge_notification_fanout_seconds_bucket{le=\"+Inf\"} 5\ngorge_notification_slow_consumer_disconnects_total 1\n",
        );
        let after = parse(
            "gorge_notification_fanout_seconds_bucket{le=\"0.001\"} 95\ngorge_notification_fanout_seconds_bucket{le=\"0.002\"} 104\ngorge_notification_fanout_seconds_bucket{le=\"+Inf\"} 105\ngorge_notification_slow_consumer_disconnects_total 4\n\
             gorge_notification_admin_post_seconds_bucket{le=\"0.0001\"} 99\ngorge_notification_admin_post_seconds_bucket{le=\"0.0002\"} 100\ngorge_notification_admin_post_seconds_bucket{le=\"+Inf\"} 100\n",
        );
        let d = delta(&before, &after);
        assert_eq!(d.fanout_p50_le_ms, Some(1.0));
        assert_eq!(d.fanout_p99_le_ms, Some(2.0));
        assert_eq!(d.admin_post_p99_le_ms, Some(0.1));
        assert_eq!(d.slow_consumer_disconnects, Some(3.0));
    }

    #[test]
    fn sums_a_family_by_label() {
        let snapshot = parse(
            "peer_relays_total{peer=\"a\",result=\"dropped\"} 2\n\
             peer_relays_total{peer=\"b\",result=\"dropped\"} 3\n\
             peer_relays_total{peer=\"b\",result=\"ok\"} 9\n\
             peer_relays_total_other 100\n",
        );
        assert_eq!(
            snapshot.sum_where("peer_relays_total", "result=\"dropped\""),
            5.0
        );
        assert_eq!(snapshot.sum_where("peer_relays_total", ""), 14.0);
    }

    #[test]
    fn no_metrics_no_figures() {
        let d = delta(&Snapshot::default(), &Snapshot::default());
        assert_eq!(d.fanout_p99_le_ms, None);
        assert_eq!(d.slow_consumer_disconnects, None);
    }
}
