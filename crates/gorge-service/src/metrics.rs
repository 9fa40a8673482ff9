//! Metrics every service exports the same way: the service registry, whose prefix
//! (`gorge_notification`, `gorge_webhook`) every metric registered in it inherits, with
//! `<prefix>_build_info{version}`; and the standard unprefixed `process_*` metrics, read
//! from `/proc` on each scrape.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabel {
    version: &'static str,
}

/// A registry whose metrics are all named `<prefix>_…`, holding `<prefix>_build_info`.
pub fn service_registry(prefix: &str, version: &'static str) -> Registry {
    let mut registry = Registry::with_prefix(prefix);
    let build_info: Family<VersionLabel, Gauge> = Family::default();
    build_info.get_or_create(&VersionLabel { version }).set(1);
    registry.register(
        "build_info",
        "Always 1; the version label is the running build",
        build_info,
    );
    registry
}

/// A registry holding only the `process_*` collector (no prefix, as every Prometheus
/// client names them).
pub fn process_registry() -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(ProcessCollector));
    registry
}

/// Linux reports CPU times and start times in clock ticks of `USER_HZ`, which the kernel
/// fixes at 100 for every architecture's user-space interface.
const TICKS_PER_SECOND: f64 = 100.0;

/// What `/proc` says about this process; `None` fields are left out of the exposition.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ProcessStats {
    /// User plus system CPU time (`process_cpu_seconds_total`).
    pub cpu_seconds: Option<f64>,
    /// Resident set size (`process_resident_memory_bytes`).
    pub resident_bytes: Option<u64>,
    /// Virtual memory size (`process_virtual_memory_bytes`).
    pub virtual_bytes: Option<u64>,
    /// Open file descriptors (`process_open_fds`).
    pub open_fds: Option<u64>,
    /// The soft open-files limit (`process_max_fds`).
    pub max_fds: Option<u64>,
    /// Process start as a Unix time (`process_start_time_seconds`).
    pub start_time_seconds: Option<f64>,
}

impl ProcessStats {
    /// Reads `/proc/self/{stat,status,fd,limits}` and `/proc/stat`.
    pub fn read() -> ProcessStats {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        let mut stats = ProcessStats::default();
        if let Some(stat) = read("/proc/self/stat") {
            stats.apply_stat(&stat, read("/proc/stat").as_deref());
        }
        if let Some(status) = read("/proc/self/status") {
            stats.resident_bytes = status_kib(&status, "VmRSS:").map(|kib| kib * 1024);
        }
        stats.open_fds = std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|dir| dir.count() as u64);
        stats.max_fds = read("/proc/self/limits").and_then(|l| max_open_files(&l));
        stats
    }

    /// Fields of `/proc/self/stat` after the command name: utime (14), stime (15),
    /// starttime (22), vsize (23), numbered as in proc(5).
    fn apply_stat(&mut self, stat: &str, proc_stat: Option<&str>) {
        let Some((_, after_comm)) = stat.rsplit_once(')') else {
            return;
        };
        // after_comm starts with field 3 (state).
        let fields: Vec<&str> = after_comm.split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
        if let (Some(utime), Some(stime)) = (field(14), field(15)) {
            self.cpu_seconds = Some((utime + stime) as f64 / TICKS_PER_SECOND);
        }
        self.virtual_bytes = field(23);
        let boot_time = proc_stat.and_then(|text| {
            text.lines()
                .find_map(|line| line.strip_prefix("btime "))
                .and_then(|v| v.trim().parse::<u64>().ok())
        });
        if let (Some(start), Some(boot)) = (field(22), boot_time) {
            self.start_time_seconds = Some(boot as f64 + start as f64 / TICKS_PER_SECOND);
        }
    }
}

fn status_kib(status: &str, key: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse().ok()
}

fn max_open_files(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    // "Max open files  <soft>  <hard>  files"
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[derive(Debug)]
struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let stats = ProcessStats::read();
        if let Some(cpu) = stats.cpu_seconds {
            let counter = ConstCounter::new(cpu);
            counter.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "User and system CPU time spent, in seconds",
                None,
                counter.metric_type(),
            )?)?;
        }
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                stats.resident_bytes.map(|v| v as f64),
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                stats.virtual_bytes.map(|v| v as f64),
            ),
            (
                "process_open_fds",
                "Open file descriptors",
                stats.open_fds.map(|v| v as f64),
            ),
            (
                "process_max_fds",
                "Soft limit on open file descriptors",
                stats.max_fds.map(|v| v as f64),
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch, in seconds",
                stats.start_time_seconds,
            ),
        ];
        for (name, help, value) in gauges {
            if let Some(value) = value {
                let gauge = ConstGauge::new(value);
                gauge.encode(encoder.encode_descriptor(
                    name,
                    help,
                    None,
                    gauge.metric_type(),
                )?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_read_after_the_command_name() {
        // A command name with spaces and a parenthesis must not shift the fields.
        let stat = "4242 (gorge (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 \
                    9 0 123400 104857600 2000 18446744073709551615";
        let mut stats = ProcessStats::default();
        stats.apply_stat(stat, Some("cpu  1 2 3\nbtime 1700000000\n"));
        assert_eq!(stats.cpu_seconds, Some(3.0));
        assert_eq!(stats.virtual_bytes, Some(104_857_600));
        assert_eq!(stats.start_time_seconds, Some(1_700_001_234.0));
        assert_eq!(
            status_kib("Name:\tx\nVmRSS:\t   5120 kB\n", "VmRSS:"),
            Some(5120)
        );
        assert_eq!(
            max_open_files(
                "Limit Soft Hard Units\nMax open files            1024                 524288               files\n"
            ),
            Some(1024)
        );
    }

    #[test]
    fn exposition_has_build_info_and_process_metrics() {
        let registry = service_registry("gorge_test", "1.2.3");
        let mut text = String::new();
        prometheus_client::encoding::text::encode_registry(&mut text, &process_registry()).unwrap();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("gorge_test_build_info{version=\"1.2.3\"} 1\n"),
            "{text}"
        );
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "process_max_fds ",
            "process_start_time_seconds ",
        ] {
            assert!(text.lines().any(|l| l.starts_with(name)), "{name}: {text}");
        }
    }
}
