//! `gorge-notification status`: what `bin/aphlict status` says (running or not, exit 0 or 1)
//! and what Phorge's notification-servers page shows, plus what a cluster operator needs:
//! listeners, readiness, sockets, the instance's counters and every peer up or down. It reads
//! only the admin port — `/status/` (Aphlict's object, unchanged), `/readyz`, and `/metrics`
//! for sockets and peers — and probes the client port as Phorge does (a plain GET must be
//! answered 501).

use std::fmt::Write as _;

use serde_json::Value;

use super::{agent, get, Targets};
use crate::metrics::PREFIX;

/// The 24-byte body of the client port's answer to plain HTTP.
const CLIENT_501_BODY: &str = "HTTP/501 Use Websockets\n";

/// The report, and whether the server is running with both ports answering (exit 0).
#[derive(Debug)]
pub struct Report {
    pub text: String,
    pub running: bool,
    /// When not running: one line saying why.
    pub why_not: Option<String>,
}

/// Collects the report; never fails (what could not be read is said in it).
pub fn run(targets: &Targets) -> Report {
    let agent = agent(targets);
    let mut text = String::new();
    let status_url = targets.admin_url("/status/");
    let status =
        get(&agent, &status_url, "application/json").and_then(
            |answer| match serde_json::from_str::<Value>(&answer.body) {
                Ok(value) if answer.status == 200 && value.is_object() => Ok(value),
                _ => Err(format!("{status_url} answered {}", answer.status)),
            },
        );
    let status = match status {
        Ok(status) => status,
        Err(why) => {
            let _ = writeln!(
                text,
                "gorge-notification is not running at {}",
                targets.admin
            );
            return Report {
                text,
                running: false,
                why_not: Some(format!("status: {why}")),
            };
        }
    };
    let readiness = get(
        &agent,
        &format!("{}/readyz", targets.admin),
        "application/json",
    )
    .map(|answer| readiness(&answer.body))
    .unwrap_or_else(|why| format!("readiness unknown ({why})"));
    let server = status["server"].as_str().unwrap_or("gorge-notification");
    let _ = writeln!(
        text,
        "{server} is running at {}: up {}, {readiness}",
        targets.admin,
        uptime(status["uptime"].as_u64().unwrap_or(0))
    );

    let _ = writeln!(text, "  admin    {}  up", targets.admin);
    let client_url = targets.websocket_url();
    let probe_url = client_url
        .replacen("ws://", "http://", 1)
        .replacen("wss://", "https://", 1);
    let client = match get(&agent, &probe_url, "*/*") {
        Ok(answer) if answer.status == 501 && answer.body == CLIENT_501_BODY => Ok(()),
        Ok(answer) => Err(format!(
            "answered {} to plain HTTP; Phorge expects 501",
            answer.status
        )),
        Err(why) => Err(why),
    };
    let _ = match &client {
        Ok(()) => writeln!(
            text,
            "  client   {client_url}  up (501 to plain HTTP, as Phorge checks)"
        ),
        Err(why) => writeln!(text, "  client   {client_url}  DOWN: {why}"),
    };

    let metrics = get(&agent, &format!("{}/metrics", targets.admin), "text/plain")
        .ok()
        .filter(|answer| answer.status == 200)
        .map(|answer| Samples::parse(&answer.body));
    match &metrics {
        Some(samples) => {
            let open = |class: &str| {
                samples.value(
                    &format!("{PREFIX}_sockets_open"),
                    &[("instance_class", class)],
                )
            };
            let (default, named) = (open("default").unwrap_or(0.0), open("named").unwrap_or(0.0));
            let _ = writeln!(
                text,
                "  sockets  {} open (instance default {default}, named instances {named})",
                default + named
            );
        }
        None => {
            let _ = writeln!(text, "  sockets  unknown (/metrics did not answer)");
        }
    }
    let _ = writeln!(
        text,
        "  instance {}: {} open, {} since start; history {} messages{}",
        status["instance"].as_str().unwrap_or(&targets.instance),
        status["clients.active"],
        status["clients.total"],
        status["history.size"],
        status["history.age"]
            .as_u64()
            .map(|age| format!(", oldest {age} ms"))
            .unwrap_or_default()
    );
    let _ = writeln!(
        text,
        "  messages {} in, {} out (all instances)",
        status["messages.in"], status["messages.out"]
    );
    if let Some(samples) = &metrics {
        let mut peers = samples.labelled(&format!("{PREFIX}_peer_up"), "peer");
        peers.sort_by(|a, b| a.0.cmp(&b.0));
        if peers.is_empty() {
            let _ = writeln!(
                text,
                "  peers    none (no cluster peers configured or discovered)"
            );
        } else {
            let list: Vec<String> = peers
                .iter()
                .map(|(peer, up)| format!("{peer} {}", if *up == 1.0 { "up" } else { "down" }))
                .collect();
            let _ = writeln!(text, "  peers    {}: {}", peers.len(), list.join(", "));
        }
    }
    Report {
        text,
        running: client.is_ok(),
        why_not: client
            .err()
            .map(|why| format!("status: client port {client_url}: {why}")),
    }
}

fn readiness(body: &str) -> String {
    let value: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    match value["status"].as_str() {
        Some("ok") => "ready".to_string(),
        Some("draining") => "draining (shutting down)".to_string(),
        _ => format!(
            "not ready: {}",
            value["reason"].as_str().unwrap_or(body.trim())
        ),
    }
}

fn uptime(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..=59 => format!("{s} s"),
        60..=3599 => format!("{} min {} s", s / 60, s % 60),
        3600..=86_399 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        _ => format!("{} d {} h", s / 86_400, s % 86_400 / 3600),
    }
}

/// One sample line: name, labels, value.
type Sample = (String, Vec<(String, String)>, f64);

/// Samples of a Prometheus text exposition.
struct Samples(Vec<Sample>);

impl Samples {
    fn parse(text: &str) -> Samples {
        Samples(text.lines().filter_map(parse_sample).collect())
    }

    /// The value of the sample `name` whose labels include `labels`.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.0
            .iter()
            .find(|(n, l, _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|(_, _, value)| *value)
    }

    /// `(label value, sample value)` of every `name` sample, by `label`.
    fn labelled(&self, name: &str, label: &str) -> Vec<(String, f64)> {
        self.0
            .iter()
            .filter(|(n, _, _)| n == name)
            .filter_map(|(_, labels, value)| {
                labels
                    .iter()
                    .find(|(k, _)| k == label)
                    .map(|(_, v)| (v.clone(), *value))
            })
            .collect()
    }
}

/// `name{k="v",…} value` (no timestamp: the services write none).
fn parse_sample(line: &str) -> Option<Sample> {
    if line.starts_with('#') || line.trim().is_empty() {
        return None;
    }
    let (series, value) = line.rsplit_once(' ')?;
    let value = value.parse::<f64>().ok()?;
    let Some((name, rest)) = series.split_once('{') else {
        return Some((series.to_string(), Vec::new(), value));
    };
    let mut labels = Vec::new();
    let mut chars = rest.strip_suffix('}')?.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() {
            break;
        }
        if chars.next() != Some('"') {
            return None;
        }
        let mut val = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next()? {
                    'n' => val.push('\n'),
                    other => val.push(other),
                },
                '"' => break,
                c => val.push(c),
            }
        }
        labels.push((key.trim_start_matches(',').to_string(), val));
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
    Some((name.to_string(), labels, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_read_with_their_labels() {
        let samples = Samples::parse(
            "# HELP x_peer_up Up.\n# TYPE x_peer_up gauge\n\
             x_peer_up{peer=\"10.0.0.2:22281\"} 1\nx_peer_up{peer=\"a\\\"b\"} 0\n\
             x_sockets_open{instance_class=\"default\"} 3\nx_plain 2.5\n",
        );
        assert_eq!(
            samples.labelled("x_peer_up", "peer"),
            [
                ("10.0.0.2:22281".to_string(), 1.0),
                ("a\"b".to_string(), 0.0)
            ]
        );
        assert_eq!(
            samples.value("x_sockets_open", &[("instance_class", "default")]),
            Some(3.0)
        );
        assert_eq!(
            samples.value("x_sockets_open", &[("instance_class", "named")]),
            None
        );
        assert_eq!(samples.value("x_plain", &[]), Some(2.5));
    }

    #[test]
    fn uptime_and_readiness_read_as_words() {
        assert_eq!(uptime(59_999), "59 s");
        assert_eq!(uptime(3_725_000), "1 h 2 min");
        assert_eq!(readiness(r#"{"status":"ok"}"#), "ready");
        assert_eq!(
            readiness(r#"{"status":"unavailable","reason":"x"}"#),
            "not ready: x"
        );
    }
}
