//! The few OS facts the bench needs: the open-file limit, a process's RSS and CPU time
//! from /proc, and signals to child processes (through rustix: the workspace forbids
//! `unsafe`).

use std::io;

pub use rustix::process::Signal;
use rustix::process::{getrlimit, kill_process, setrlimit, Pid, Resource, Rlimit};

/// Raises RLIMIT_NOFILE to at least `want` (the hard limit too when privileged, as root is
/// here) and returns the soft limit now in force (`u64::MAX` for unlimited). Unprivileged,
/// it settles for the hard limit.
pub fn raise_nofile(want: u64) -> io::Result<u64> {
    let current = getrlimit(Resource::Nofile);
    let soft = current.current.unwrap_or(u64::MAX);
    if soft >= want {
        return Ok(soft);
    }
    let wanted = Rlimit {
        current: Some(want),
        maximum: current.maximum.map(|hard| hard.max(want)),
    };
    if setrlimit(Resource::Nofile, wanted).is_ok() {
        return Ok(want);
    }
    let capped = Rlimit {
        current: current.maximum,
        maximum: current.maximum,
    };
    setrlimit(Resource::Nofile, capped)?;
    Ok(capped.current.unwrap_or(u64::MAX))
}

/// Clock ticks per second, the unit of utime/stime in /proc/PID/stat.
pub fn clock_ticks_per_second() -> u64 {
    match rustix::param::clock_ticks_per_second() {
        0 => 100,
        ticks => ticks,
    }
}

/// Resident set size of `pid` in bytes (VmRSS).
pub fn rss_bytes(pid: u32) -> io::Result<u64> {
    status_bytes(pid, "VmRSS:")
}

/// The anonymous part of `pid`'s resident set (RssAnon: heap and stacks, without the
/// binary's own pages, which stay resident once touched).
pub fn rss_anon_bytes(pid: u32) -> io::Result<u64> {
    status_bytes(pid, "RssAnon:")
}

/// [`rss_bytes`] in MiB to one decimal, as the bench reports it; `None` without a pid.
pub fn rss_mib(pid: Option<u32>) -> Option<f64> {
    rss_bytes(pid?).ok().map(mib)
}

/// [`rss_anon_bytes`] in MiB to one decimal; `None` without a pid.
pub fn rss_anon_mib(pid: Option<u32>) -> Option<f64> {
    rss_anon_bytes(pid?).ok().map(mib)
}

fn mib(bytes: u64) -> f64 {
    (bytes as f64 / 1048576.0 * 10.0).round() / 10.0
}

/// The `key` line of `/proc/PID/status` (a size in kB), in bytes.
fn status_bytes(pid: u32, key: &str) -> io::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    parse_kib_line(&status, key)
        .ok_or_else(|| io::Error::other(format!("no {key} line in /proc/PID/status")))
}

fn parse_kib_line(status: &str, key: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// User plus system CPU time of `pid` in seconds.
pub fn cpu_seconds(pid: u32) -> io::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let ticks = parse_cpu_ticks(&stat).ok_or_else(|| io::Error::other("bad /proc/PID/stat"))?;
    Ok(ticks as f64 / clock_ticks_per_second() as f64)
}

/// utime + stime (fields 14 and 15); counted after the `)` that ends the command name,
/// because the name itself may contain spaces or parentheses.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Lowers the calling thread's scheduling priority to `nice` (Linux: a nice value is per
/// thread). Raising it back needs privilege, so this is one-way for a thread.
pub fn nice_this_thread(nice: i32) -> io::Result<()> {
    rustix::process::setpriority_process(Some(rustix::thread::gettid()), nice)?;
    Ok(())
}

/// Scheduler figures of one thread, from `/proc/PID/task/TID/schedstat` and `comm`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ThreadSched {
    pub name: String,
    /// Time on a CPU, in ns.
    pub run_ns: u64,
    /// Time runnable but waiting for a CPU (the run queue), in ns.
    pub wait_ns: u64,
    /// Times the thread was given a CPU.
    pub slices: u64,
}

/// Every thread of `pid`, by thread id.
pub fn threads_sched(pid: u32) -> std::collections::BTreeMap<u32, ThreadSched> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        let Some(tid) = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<u32>().ok())
        else {
            continue;
        };
        let dir = task.path();
        let (Ok(stat), Ok(name)) = (
            std::fs::read_to_string(dir.join("schedstat")),
            std::fs::read_to_string(dir.join("comm")),
        ) else {
            continue;
        };
        if let Some(mut sched) = parse_schedstat(&stat) {
            sched.name = name.trim().to_string();
            out.insert(tid, sched);
        }
    }
    out
}

fn parse_schedstat(text: &str) -> Option<ThreadSched> {
    let mut fields = text.split_whitespace().map(|f| f.parse::<u64>().ok());
    Some(ThreadSched {
        name: String::new(),
        run_ns: fields.next()??,
        wait_ns: fields.next()??,
        slices: fields.next()??,
    })
}

/// The 1-minute load average (`/proc/loadavg`): how busy the machine was around a run, for
/// reading its figures (other work on the same cores shows up as latency).
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Sends `signal` (e.g. [`Signal::TERM`]) to `pid`.
pub fn send_signal(pid: u32, signal: Signal) -> io::Result<()> {
    let pid = i32::try_from(pid)
        .ok()
        .and_then(Pid::from_raw)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a process id"))?;
    kill_process(pid, signal)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rss_line() {
        let status = "Name:\tx\nVmPeak:\t  9 kB\nVmRSS:\t    1234 kB\nThreads:\t2\n";
        assert_eq!(parse_kib_line(status, "VmRSS:"), Some(1234 * 1024));
    }

    #[test]
    fn reads_cpu_ticks_past_odd_names() {
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 17 5 0 0 20 0 1 0 9 1 1";
        assert_eq!(parse_cpu_ticks(stat), Some(22));
    }

    #[test]
    fn reads_schedstat() {
        let sched = parse_schedstat("123 45 6\n").unwrap();
        assert_eq!((sched.run_ns, sched.wait_ns, sched.slices), (123, 45, 6));
        assert!(!threads_sched(std::process::id()).is_empty());
    }

    #[test]
    fn reads_limits_and_refuses_pid_0() {
        assert!(raise_nofile(64).unwrap() >= 64);
        assert!(send_signal(0, Signal::TERM).is_err());
    }

    #[test]
    fn own_process_is_readable() {
        let pid = std::process::id();
        assert!(rss_bytes(pid).unwrap() > 0);
        assert!(rss_anon_mib(Some(pid)).unwrap() > 0.0);
        assert_eq!(rss_mib(None), None);
        assert_eq!(mib(1_572_864), 1.5);
        assert!(cpu_seconds(pid).unwrap() >= 0.0);
        assert!(load_average().unwrap() >= 0.0);
    }
}
