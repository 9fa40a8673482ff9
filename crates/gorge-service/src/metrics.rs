//! Metrics, each family declared once. A service lists its families in
//! [`metrics!`](crate::metrics!) — name, type, labels with the series that exist from the
//! start, help — which gives the struct the code counts into, the registration, and the
//! docs table (checked by each service's tests). Here too: the service registry, whose prefix
//! (`gorge_notification`, `gorge_webhook`) every family registered in it inherits, with
//! `<prefix>_build_info{version}`; and the standard unprefixed `process_*` metrics, read from
//! `/proc` on each scrape.

use std::borrow::Cow;
use std::fmt;
use std::ops::Deref;
use std::sync::OnceLock;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

pub use prometheus_client::metrics::counter::Counter;
pub use prometheus_client::metrics::gauge::Gauge;
pub use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

/// A gauge of fractional values (seconds of lag and the like).
pub type GaugeF64 = Gauge<f64, std::sync::atomic::AtomicU64>;

/// The label set of a [`Labeled`] family: each label's name with its value.
pub type LabelSet<const N: usize> = [(&'static str, Cow<'static, str>); N];

/// A family with `N` labels, whose names are fixed by its declaration; the values are given
/// in that order. Cheap to clone (shared).
pub struct Labeled<M, const N: usize> {
    names: [&'static str; N],
    family: Family<LabelSet<N>, M>,
}

impl<M, const N: usize> Clone for Labeled<M, N> {
    fn clone(&self) -> Self {
        Labeled {
            names: self.names,
            family: self.family.clone(),
        }
    }
}

impl<M: fmt::Debug, const N: usize> fmt::Debug for Labeled<M, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.family.fmt(f)
    }
}

impl<M: Default + Clone, const N: usize> Labeled<M, N> {
    /// An empty family labelled `names`.
    pub fn new(names: [&'static str; N]) -> Self {
        Labeled {
            names,
            family: Family::default(),
        }
    }

    fn labels(&self, values: [Cow<'static, str>; N]) -> LabelSet<N> {
        let mut values = values.into_iter();
        self.names
            .map(|name| (name, values.next().unwrap_or_default()))
    }

    /// The series of these label values (created at 0 if new).
    pub fn with(&self, values: [&'static str; N]) -> impl Deref<Target = M> + '_ {
        self.family
            .get_or_create(&self.labels(values.map(Cow::Borrowed)))
    }

    /// The series of these label values, owned (for values known only at run time, such as a
    /// peer's address), to be kept by whoever counts into it.
    pub fn with_owned(&self, values: [String; N]) -> M {
        self.family
            .get_or_create_owned(&self.labels(values.map(Cow::Owned)))
    }

    /// Removes the series of these label values from the exposition.
    pub fn remove(&self, values: [String; N]) {
        self.family.remove(&self.labels(values.map(Cow::Owned)));
    }
}

impl<M: TypedMetric, const N: usize> TypedMetric for Labeled<M, N> {
    const TYPE: MetricType = M::TYPE;
}

impl<M: EncodeMetric + TypedMetric, const N: usize> EncodeMetric for Labeled<M, N> {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), fmt::Error> {
        self.family.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        M::TYPE
    }
}

/// One declared family, for the docs table.
#[derive(Debug, Clone)]
pub struct FamilyDoc {
    /// The name as registered (without the registry's prefix, and without `_total`).
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: MetricType,
    /// The label names, in order.
    pub labels: &'static [&'static str],
    /// The label values of the series that exist from the start.
    pub series: Vec<Vec<&'static str>>,
    /// The help text, which `/metrics` serves and the docs table shows.
    pub help: &'static str,
}

impl FamilyDoc {
    /// The name `/metrics` shows, given the registry's prefix (`""` for none): counters end
    /// in `_total`.
    pub fn exposed_name(&self, prefix: &str) -> String {
        let prefix = if prefix.is_empty() {
            String::new()
        } else {
            format!("{prefix}_")
        };
        let suffix = if matches!(self.kind, MetricType::Counter) {
            "_total"
        } else {
            ""
        };
        format!("{prefix}{}{suffix}", self.name)
    }
}

#[doc(hidden)]
#[macro_export]
macro_rules! __metric_count {
    () => { 0usize };
    ($head:ident $($rest:ident)*) => { 1usize + $crate::__metric_count!($($rest)*) };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __metric_type {
    ($kind:ident) => { $crate::metrics::$kind };
    ($kind:ident [$($label:ident),+]) => {
        $crate::metrics::Labeled<$crate::metrics::$kind, { $crate::__metric_count!($($label)+) }>
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __metric_new {
    ($kind:ident) => { <$crate::metrics::$kind>::default() };
    ($kind:ident ($($arg:expr),*)) => { <$crate::metrics::$kind>::new($($arg),*) };
    ($kind:ident [$($label:ident),+]) => { $crate::metrics::Labeled::new([$(stringify!($label)),+]) };
}

/// Declares a service's metric families: a struct with one field per family, `register`,
/// which creates and registers them (the listed series at 0), and `families`, for the docs.
/// One line per family: `name: Type, "help";`, with `Histogram(buckets)`, or labels and the
/// series that exist from the start (any expression yielding arrays of label values):
///
/// ```
/// gorge_service::metrics! {
///     /// The example's metrics.
///     pub struct Metrics {
///         polls: Counter, "Poll rounds completed";
///         attempt_duration_seconds: Histogram(gorge_service::metrics::exponential_buckets(0.005, 2.0, 13)),
///             "Duration of HTTP attempts";
///         claims: Counter[result] = [["won"], ["lost"]], "Claims by result";
///     }
/// }
/// let metrics = Metrics::register(&mut prometheus_client::registry::Registry::default());
/// metrics.claims.with(["won"]).inc();
/// ```
#[macro_export]
macro_rules! metrics {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $(
                $field:ident : $kind:ident $( ( $($arg:expr),* ) )?
                    $( [ $($label:ident),+ ] $( = $series:expr )? )?,
                    $help:literal;
            )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug)]
        $vis struct $name {
            $(
                #[doc = $help]
                pub $field: $crate::__metric_type!($kind $( [ $($label),+ ] )?),
            )*
        }

        impl $name {
            /// Creates every family, with the series that exist from the start, and registers
            /// it in `registry` (whose prefix names it).
            pub fn register(registry: &mut $crate::__prometheus_client::registry::Registry) -> Self {
                let metrics = $name {
                    $( $field: $crate::__metric_new!($kind $( ( $($arg),* ) )? $( [ $($label),+ ] )?), )*
                };
                $( $( $(
                    for values in $series {
                        let _ = metrics.$field.with(values);
                    }
                )? )? )*
                $( registry.register(stringify!($field), $help, metrics.$field.clone()); )*
                metrics
            }

            /// Every family as declared, for the docs table.
            pub fn families() -> Vec<$crate::metrics::FamilyDoc> {
                vec![ $( $crate::metrics::FamilyDoc {
                    name: stringify!($field),
                    kind: <$crate::__metric_type!($kind $( [ $($label),+ ] )?)
                        as $crate::__prometheus_client::metrics::TypedMetric>::TYPE,
                    labels: &[ $( $( stringify!($label) ),+ )? ],
                    series: {
                        #[allow(unused_mut)]
                        let mut series: Vec<Vec<&'static str>> = Vec::new();
                        $( $( series.extend($series.iter().map(|values| values.to_vec())); )? )?
                        series
                    },
                    help: $help,
                }, )* ]
            }
        }
    };
}

crate::metrics! {
    /// The family every service registry holds.
    struct BuildInfo {
        build_info: Gauge[version], "Always 1; the version label is the running build";
    }
}

crate::metrics! {
    /// The families the probes count into, registered in the service registry by
    /// [`Probes::new`](crate::Probes::new).
    pub struct ProbeMetrics {
        readiness_changes: Counter,
            "Times GET /readyz changed between ready and not ready (draining counts as not \
             ready), as seen by whoever probes it: the kubelet every few seconds, nobody on a \
             VM unless something probes";
            log_lines_dropped: SharedCounter(dropped_log_lines()),
            "Log lines that could not be written to stdout (a closed pipe, journald \
             restarting) and were dropped; the next line is tried afresh";
    }
}

/// Log lines dropped because writing them failed, in this process (stdout is the process's):
/// the log writer counts here, and every service registry exposes it
/// (`<prefix>_log_lines_dropped_total`, registered with the probes' families).
pub fn dropped_log_lines() -> &'static Counter {
    static DROPPED: OnceLock<Counter> = OnceLock::new();
    DROPPED.get_or_init(Counter::default)
}

/// A counter owned by the process rather than by one registry (the log writer's, which
/// exists before any registry), exposed by every registry that registers it.
#[derive(Clone, Debug)]
pub struct SharedCounter(Counter);

impl SharedCounter {
    /// Exposes `counter` (a clone shares its value).
    pub fn new(counter: &Counter) -> SharedCounter {
        SharedCounter(counter.clone())
    }

    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.get()
    }
}

impl TypedMetric for SharedCounter {
    const TYPE: MetricType = MetricType::Counter;
}

impl EncodeMetric for SharedCounter {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

/// A registry whose metrics are all named `<prefix>_…`, holding `<prefix>_build_info`.
pub fn service_registry(prefix: &str, version: &'static str) -> Registry {
    let mut registry = Registry::with_prefix(prefix);
    BuildInfo::register(&mut registry)
        .build_info
        .with([version])
        .set(1);
    registry
}

/// A registry holding only the `process_*` collector (no prefix, as every Prometheus
/// client names them).
pub fn process_registry() -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(ProcessCollector));
    registry
}

/// The `process_*` families, in exposition order, as every Prometheus client names them.
const PROCESS_FAMILIES: [(&str, MetricType, &str); 6] = [
    (
        "process_cpu_seconds",
        MetricType::Counter,
        "User and system CPU time spent, in seconds (read from /proc on each scrape, as all process_* metrics)",
    ),
    (
        "process_resident_memory_bytes",
        MetricType::Gauge,
        "Resident memory size in bytes",
    ),
    (
        "process_virtual_memory_bytes",
        MetricType::Gauge,
        "Virtual memory size in bytes",
    ),
    ("process_open_fds", MetricType::Gauge, "Open file descriptors"),
    (
        "process_max_fds",
        MetricType::Gauge,
        "Soft limit on open file descriptors (RLIMIT_NOFILE)",
    ),
    (
        "process_start_time_seconds",
        MetricType::Gauge,
        "Start time of the process since the Unix epoch, in seconds",
    ),
];

/// A service's metrics table in docs/: `<prefix>_build_info`, the probes' families, the
/// service's `families`, then the unprefixed `process_*` ones.
pub fn docs_table(prefix: &str, families: &[FamilyDoc]) -> String {
    let process = PROCESS_FAMILIES.map(|(name, kind, help)| FamilyDoc {
        name,
        kind,
        labels: &[],
        series: Vec::new(),
        help,
    });
    let prefixed = BuildInfo::families()
        .into_iter()
        .chain(ProbeMetrics::families())
        .chain(families.iter().cloned());
    let rows: Vec<Vec<String>> = prefixed
        .map(|family| (family.exposed_name(prefix), family))
        .chain(
            process
                .into_iter()
                .map(|family| (family.exposed_name(""), family)),
        )
        .map(|(name, family)| {
            let mut labels: Vec<String> = family.labels.iter().map(|n| format!("`{n}`")).collect();
            if !family.series.is_empty() {
                let series: Vec<String> = family
                    .series
                    .iter()
                    .map(|values| format!("`{}`", values.join("`/`")))
                    .collect();
                labels = vec![format!("{}: {}", labels.join(", "), series.join(", "))];
            }
            vec![
                format!("`{name}`"),
                family.kind.as_str().to_string(),
                labels.join(", "),
                family.help.to_string(),
            ]
        })
        .collect();
    crate::docs::table(
        &[
            "Metric",
            "Type",
            "Labels (series from the start)",
            "Meaning",
        ],
        &rows,
    )
}

/// The formats `/metrics` serves, chosen from the scraper's `Accept` header
/// ([`Exposition::negotiate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exposition {
    /// OpenMetrics 1.0.0 text, what prometheus-client writes: for a scraper that prefers it
    /// (Prometheus asks for it first).
    OpenMetrics,
    /// Prometheus text format 0.0.4: for every other client (curl, `promtool check metrics`,
    /// agents that only speak it). Its `# HELP`/`# TYPE` lines name the sample (`x_total`),
    /// where OpenMetrics names the family (`x`): served as OpenMetrics, every counter would
    /// read as a sample without help text to these clients.
    PrometheusText,
}

impl Exposition {
    /// The format for an `Accept` header: OpenMetrics when the client gives it a higher
    /// quality than plain text (a missing `q` is 1), the text format otherwise, including
    /// when there is no header or nothing in it is served here (a scrape gets an answer
    /// rather than 406).
    pub fn negotiate(accept: Option<&str>) -> Exposition {
        let mut openmetrics = 0.0f32;
        let mut text = 0.0f32;
        for range in accept.unwrap_or("").split(',') {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or("").to_ascii_lowercase();
            let quality = parts
                .filter_map(|param| param.split_once('='))
                .find(|(name, _)| name.trim().eq_ignore_ascii_case("q"))
                .map_or(Some(1.0), |(_, value)| value.trim().parse::<f32>().ok())
                .unwrap_or(0.0);
            match media.as_str() {
                "application/openmetrics-text" => openmetrics = openmetrics.max(quality),
                "text/plain" | "text/*" | "*/*" => text = text.max(quality),
                _ => {}
            }
        }
        if openmetrics > text {
            Exposition::OpenMetrics
        } else {
            Exposition::PrometheusText
        }
    }

    /// The `Content-Type` of an answer in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Exposition::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Exposition::PrometheusText => "text/plain; version=0.0.4; charset=utf-8",
        }
    }

    /// `registries` in this format, in order.
    pub fn encode(self, registries: &[&Registry]) -> String {
        let mut text = String::new();
        for registry in registries {
            // Writing into a String cannot fail.
            let _ = prometheus_client::encoding::text::encode_registry(&mut text, registry);
        }
        match self {
            Exposition::OpenMetrics => {
                let _ = prometheus_client::encoding::text::encode_eof(&mut text);
                text
            }
            Exposition::PrometheusText => openmetrics_to_prometheus_text(&text),
        }
    }
}

/// Rewrites prometheus-client's OpenMetrics text (without `# EOF`) into the Prometheus text
/// format: a counter family's `# HELP`/`# TYPE` name its `_total` sample, `# UNIT` lines
/// go, and a type the text format lacks becomes `untyped` (prometheus-client writes
/// `info` and `unknown` for collectors; the families declared here are counters, gauges and
/// histograms, whose samples are written alike in both formats).
fn openmetrics_to_prometheus_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len() + 256);
    let mut help: Option<(&str, &str)> = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            help = Some(rest.split_once(' ').unwrap_or((rest, "")));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let (name, kind) = match kind {
                "counter" => (format!("{name}_total"), "counter"),
                "gauge" | "histogram" | "summary" => (name.to_string(), kind),
                "info" => (format!("{name}_info"), "gauge"),
                _ => (name.to_string(), "untyped"),
            };
            if let Some((_, text)) = help.take() {
                out.push_str(&format!("# HELP {name} {text}\n"));
            }
            out.push_str(&format!("# TYPE {name} {kind}\n"));
            continue;
        }
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
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
        let values = [
            stats.cpu_seconds,
            stats.resident_bytes.map(|v| v as f64),
            stats.virtual_bytes.map(|v| v as f64),
            stats.open_fds.map(|v| v as f64),
            stats.max_fds.map(|v| v as f64),
            stats.start_time_seconds,
        ];
        for ((name, kind, help), value) in PROCESS_FAMILIES.iter().zip(values) {
            let Some(value) = value else { continue };
            let descriptor = encoder.encode_descriptor(name, help, None, *kind)?;
            match kind {
                MetricType::Counter => ConstCounter::new(value).encode(descriptor)?,
                _ => ConstGauge::new(value).encode(descriptor)?,
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

    crate::metrics! {
        struct Demo {
            polls: Counter, "Rounds";
            depth: Gauge, "Depth";
            seconds: Histogram(exponential_buckets(0.5, 2.0, 2)), "Seconds";
            claims: Counter[result] = [["won"], ["lost"]], "Claims";
            pool: Gauge[pool, state] = [["query", "open"], ["lock", "held"]], "Pool";
            peers: Counter[peer], "Per peer";
        }
    }

    #[test]
    fn declared_families_are_registered_with_their_series_at_zero() {
        let mut registry = Registry::with_prefix("x");
        let demo = Demo::register(&mut registry);
        demo.claims.with(["won"]).inc();
        let peer = demo.peers.with_owned(["a:1".to_string()]);
        peer.inc_by(2);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "x_polls_total 0",
            "x_depth 0",
            "x_seconds_bucket{le=\"0.5\"} 0",
            "x_claims_total{result=\"won\"} 1",
            "x_claims_total{result=\"lost\"} 0",
            "x_pool{pool=\"query\",state=\"open\"} 0",
            "x_pool{pool=\"lock\",state=\"held\"} 0",
            "x_peers_total{peer=\"a:1\"} 2",
            "# HELP x_claims Claims.",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
        demo.peers.remove(["a:1".to_string()]);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(!text.contains("a:1"), "{text}");
        let names: Vec<String> = Demo::families()
            .iter()
            .map(|f| f.exposed_name("x"))
            .collect();
        assert_eq!(
            names,
            [
                "x_polls_total",
                "x_depth",
                "x_seconds",
                "x_claims_total",
                "x_pool",
                "x_peers_total"
            ]
        );
    }

    #[test]
    fn the_docs_table_has_build_info_the_families_and_process_metrics() {
        let table = docs_table("x", &Demo::families());
        let rows: Vec<&str> = table.lines().collect();
        assert_eq!(
            rows[0],
            "| Metric | Type | Labels (series from the start) | Meaning |"
        );
        assert_eq!(rows[2], "| `x_build_info` | gauge | `version` | Always 1; the version label is the running build |");
        assert!(
            rows[3].starts_with("| `x_readiness_changes_total` | counter |  | Times GET /readyz"),
            "{}",
            rows[3]
        );
        assert!(
            rows[4].starts_with("| `x_log_lines_dropped_total` | counter |  | Log lines"),
            "{}",
            rows[4]
        );
        assert_eq!(
            rows[8],
            "| `x_claims_total` | counter | `result`: `won`, `lost` | Claims |"
        );
        assert_eq!(
            rows[9],
            "| `x_pool` | gauge | `pool`, `state`: `query`/`open`, `lock`/`held` | Pool |"
        );
        assert_eq!(
            rows[10],
            "| `x_peers_total` | counter | `peer` | Per peer |"
        );
        assert!(
            rows[11].starts_with("| `process_cpu_seconds_total` | counter |  | "),
            "{}",
            rows[11]
        );
        assert_eq!(rows.len(), 2 + 3 + 6 + 6);
    }

    #[test]
    fn the_format_is_the_one_the_scraper_prefers() {
        use Exposition::{OpenMetrics, PrometheusText};
        for (accept, want) in [
            // Prometheus 2.x and 3.x.
            (Some("application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"), OpenMetrics),
            (Some("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"), OpenMetrics),
            // Prometheus with `scrape_protocols: [PrometheusText0.0.4]`.
            (Some("text/plain;version=0.0.4;q=1,*/*;q=0.1"), PrometheusText),
            (Some("Application/OpenMetrics-Text; version=1.0.0"), OpenMetrics),
            (Some("application/openmetrics-text;q=0, */*"), PrometheusText),
            (Some("application/openmetrics-text;q=0.5, */*;q=0.5"), PrometheusText),
            (Some("application/openmetrics-text;q=nonsense, text/plain;q=0.1"), PrometheusText),
            (Some("application/json"), PrometheusText),
            (Some("*/*"), PrometheusText),
            (Some(""), PrometheusText),
            (None, PrometheusText),
        ] {
            assert_eq!(Exposition::negotiate(accept), want, "{accept:?}");
        }
    }

    #[test]
    fn the_text_format_names_each_sample_in_help_and_type() {
        let mut registry = Registry::with_prefix("x");
        let demo = Demo::register(&mut registry);
        demo.claims.with(["won"]).inc();
        let text = Exposition::PrometheusText.encode(&[&registry]);
        let expected_start = "\
# HELP x_polls_total Rounds.
# TYPE x_polls_total counter
x_polls_total 0
# HELP x_depth Depth.
# TYPE x_depth gauge
x_depth 0
# HELP x_seconds Seconds.
# TYPE x_seconds histogram
x_seconds_sum 0.0
x_seconds_count 0
x_seconds_bucket{le=\"0.5\"} 0
x_seconds_bucket{le=\"1.0\"} 0
x_seconds_bucket{le=\"+Inf\"} 0
# HELP x_claims_total Claims.
# TYPE x_claims_total counter
";
        assert!(text.starts_with(expected_start), "{text}");
        assert!(
            text.contains("\nx_claims_total{result=\"won\"} 1\n"),
            "{text}"
        );
        let openmetrics = Exposition::OpenMetrics.encode(&[&registry]);
        assert!(
            openmetrics
                .starts_with("# HELP x_polls Rounds.\n# TYPE x_polls counter\nx_polls_total 0\n"),
            "{openmetrics}"
        );
        assert!(openmetrics.ends_with("# EOF\n"), "{openmetrics}");
        // Only the family lines differ.
        let samples = |t: &str| -> Vec<String> {
            t.lines()
                .filter(|l| !l.starts_with('#'))
                .map(str::to_string)
                .collect()
        };
        assert_eq!(samples(&text), samples(&openmetrics));
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
